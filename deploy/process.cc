#include "deploy/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace onebit::launcher {
namespace {

std::mutex& OutputMutex() {
  static std::mutex mu;
  return mu;
}

int DecodeStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::string& name,
                                                        const std::vector<std::string>& argv,
                                                        const std::string& log_path, bool echo) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    // Child: own process group, so a terminal ^C reaches the launcher, which stops us.
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  std::unique_ptr<Process> p(new Process(name, pid, fds[0]));
  p->pump_ = std::thread(&Process::Pump, p.get(), log_path, echo);
  return p;
}

void Process::Pump(std::string log_path, bool echo) {
  std::ofstream log(log_path, std::ios::app);
  std::string pending;
  char buf[4096];
  for (;;) {
    const ssize_t got = read(out_fd_, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    pending.append(buf, static_cast<size_t>(got));
    size_t eol;
    while ((eol = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      log << line << '\n';
      if (echo) {
        std::lock_guard<std::mutex> lock(OutputMutex());
        std::printf("[%s] %s\n", name_.c_str(), line.c_str());
        std::fflush(stdout);
      }
    }
  }
  if (!pending.empty()) log << pending << '\n';
  close(out_fd_);
}

bool Process::Exited(int* code) {
  if (!reaped_) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = DecodeStatus(status);
    }
  }
  if (reaped_ && code) *code = exit_code_;
  return reaped_;
}

absl::StatusOr<int> Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int code = 0;
  while (!Exited(&code)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " did not exit within ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return code;
}

void Process::Terminate(absl::Duration grace) {
  if (Exited(nullptr)) return;
  kill(pid_, SIGTERM);
  if (!Wait(grace).ok()) {
    kill(pid_, SIGKILL);
    (void)Wait(absl::Seconds(5));
  }
}

Process::~Process() {
  Terminate(absl::Seconds(2));
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
    if (watch && watch->Exited(&code)) {
      return absl::FailedPreconditionError(
          absl::StrCat(watch->name(), " exited with code ", code, " before writing ", path));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("no ", path, " after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace onebit::launcher
