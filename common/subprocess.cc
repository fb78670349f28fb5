#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

extern char** environ;

namespace onebit {
namespace {

// Echoed lines of every process go through this, so that they are never interleaved.
std::mutex& OutputMutex() {
  static std::mutex mu;
  return mu;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

void WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk loses log lines, not the child
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

absl::string_view VarName(absl::string_view entry) { return entry.substr(0, entry.find('=')); }

// Our environment less `unset` and the names `set` gives, then `set`.
absl::StatusOr<std::vector<std::string>> ChildEnvironment(const std::vector<std::string>& set,
                                                          const std::vector<std::string>& unset) {
  for (const std::string& entry : set) {
    if (entry.find('=') == std::string::npos || entry[0] == '=') {
      return absl::InvalidArgumentError(absl::StrCat("env_set entry \"", entry, "\" is not NAME=value"));
    }
  }
  auto listed = [](const std::vector<std::string>& entries, absl::string_view name) {
    return std::any_of(entries.begin(), entries.end(),
                       [&](const std::string& e) { return VarName(e) == name; });
  };
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view name = VarName(*e);
    if (!listed(unset, name) && !listed(set, name)) env.emplace_back(*e);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Closes the fds it holds unless released.
struct FdCloser {
  std::vector<int> fds;
  ~FdCloser() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const ProcessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("no command: argv is empty");
  const std::string name = options.name.empty() ? options.argv[0] : options.name;
  absl::StatusOr<std::vector<std::string>> env = ChildEnvironment(options.env_set, options.env_unset);
  if (!env.ok()) return env.status();

  // Files are opened here rather than in the child, so that a bad path is reported as
  // such, not as a failed start.
  FdCloser fds;
  auto open_append = [&](const std::string& path, int* fd) {
    *fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (*fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(name, ": cannot open ", path));
    fds.fds.push_back(*fd);
    return absl::OkStatus();
  };
  int log_fd = -1, err_fd = -1, pipe_fds[2] = {-1, -1};
  if (!options.log_path.empty()) {
    if (absl::Status s = open_append(options.log_path, &log_fd); !s.ok()) return s;
  }
  if (!options.stderr_path.empty()) {
    if (absl::Status s = open_append(options.stderr_path, &err_fd); !s.ok()) return s;
  }
  const bool piped = log_fd >= 0 || options.echo;
  if (piped) {
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
    fds.fds.push_back(pipe_fds[0]);
    fds.fds.push_back(pipe_fds[1]);
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (piped) {
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    if (err_fd < 0) posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  }
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  // Last, so that the paths above stay relative to our directory (glibc >= 2.29).
  if (!options.working_dir.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, options.working_dir.c_str());
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A process group of its own; and no blocked signals: the calling thread may block
  // SIGTERM (the servers do, to sigwait on it), and the child would inherit that mask.
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);

  std::vector<std::string> argv_strings = options.argv;
  std::vector<char*> argv = NullTerminated(argv_strings);
  std::vector<char*> envp = NullTerminated(*env);
  pid_t pid = -1;
  // glibc's posix_spawn reports a failed exec (or chdir) as its result.
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    std::string what = absl::StrCat(name, ": cannot run ", options.argv[0]);
    if (!options.working_dir.empty()) absl::StrAppend(&what, " in ", options.working_dir);
    return absl::ErrnoToStatus(rc, what);
  }
  // The child holds its ends; ours of the pipe's read end and the log go to the pump.
  fds.fds = {pipe_fds[1], err_fd};
  return std::unique_ptr<Process>(new Process(name, pid, pipe_fds[0], log_fd, options.echo));
}

Process::Process(std::string name, pid_t pid, int out_fd, int log_fd, bool echo)
    : name_(std::move(name)), pid_(pid) {
  if (out_fd >= 0) {
    pump_ = std::thread(&Process::Pump, this, out_fd, log_fd, echo);
  } else {
    pump_at_eof_.Notify();
  }
}

void Process::Pump(int out_fd, int log_fd, bool echo) {
  auto emit = [&](absl::string_view line) {
    if (log_fd >= 0) WriteAll(log_fd, absl::StrCat(line, "\n"));
    if (echo) {
      std::lock_guard<std::mutex> lock(OutputMutex());
      std::printf("[%s] %.*s\n", name_.c_str(), static_cast<int>(line.size()), line.data());
      std::fflush(stdout);
    }
  };
  std::string pending;
  char buf[4096];
  // poll with a timeout, so that FinishOutput can stop a pump that a grandchild keeps
  // from ever seeing the end of the pipe.
  while (!stop_pump_) {
    pollfd p = {out_fd, POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t got = read(out_fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    pending.append(buf, static_cast<size_t>(got));
    size_t start = 0, eol;
    while ((eol = pending.find('\n', start)) != std::string::npos) {
      emit(absl::string_view(pending).substr(start, eol - start));
      start = eol + 1;
    }
    pending.erase(0, start);
  }
  if (!pending.empty()) emit(pending);
  close(out_fd);
  if (log_fd >= 0) close(log_fd);
  pump_at_eof_.Notify();
}

void Process::FinishOutput() {
  if (!pump_.joinable()) return;
  if (!pump_at_eof_.WaitForNotificationWithTimeout(absl::Seconds(1))) stop_pump_ = true;
  pump_.join();
}

bool Process::Exited(int* code) {
  if (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      // ECHILD: someone else reaped it; the code is unknown.
      reaped_ = true;
      exit_code_ = r == pid_ ? DecodeStatus(status) : -1;
      FinishOutput();
    }
  }
  if (reaped_ && code != nullptr) *code = exit_code_;
  return reaped_;
}

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Short commands are common (a CLI in a test): poll fast at first, then every 20 ms.
  absl::Duration poll = absl::Milliseconds(1);
  int code = 0;
  while (!Exited(&code)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(name_, " did not exit within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(poll);
    poll = std::min(poll * 2, absl::Milliseconds(20));
  }
  return code;
}

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

void Process::Terminate(absl::Duration grace) {
  if (Exited(nullptr)) return;
  kill(pid_, SIGTERM);
  kill(pid_, SIGCONT);
  if (!Wait(grace).ok()) {
    kill(pid_, SIGKILL);
    (void)Wait(absl::Seconds(5));
  }
}

Process::~Process() {
  Terminate(absl::Seconds(2));
  // Only if the child could not be reaped (then the pump is not joined yet).
  stop_pump_ = true;
  if (pump_.joinable()) pump_.join();
}

absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout,
                                        Process* watch) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && st.st_size > 0) {
      std::ifstream in(path);
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    }
    int code = 0;
    if (watch != nullptr && watch->Exited(&code)) {
      return absl::FailedPreconditionError(
          absl::StrCat(watch->name(), " exited with code ", code, " before writing ", path));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no ", path, " after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

absl::StatusOr<std::string> WaitForLogMatch(const std::string& path, const std::string& pattern,
                                            absl::Duration timeout, Process* watch) {
  const std::regex re(pattern);
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int code = 0;
    const bool exited = watch != nullptr && watch->Exited(&code);  // before the last read
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    const std::string log = text.str();
    std::smatch m;
    if (std::regex_search(log, m, re)) return m.size() > 1 ? m[1].str() : m[0].str();
    const std::string tail = log.size() > 2000 ? log.substr(log.size() - 2000) : log;
    if (exited) {
      return absl::FailedPreconditionError(absl::StrCat(
          watch->name(), " exited with code ", code, " before its log said /", pattern, "/:\n",
          tail));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          path, " did not say /", pattern, "/ in ", absl::FormatDuration(timeout), ":\n", tail));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace onebit
