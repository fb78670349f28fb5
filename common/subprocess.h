// Child processes: the launcher's coordinator, servers and workers, and the binaries the
// end-to-end tests run. One class for all of them, so that exit codes, output capture,
// termination and reaping behave the same everywhere.
//
//   ProcessOptions options;
//   options.argv = {"/path/to/onebit-server", "--shard=0"};
//   options.log_path = dir + "/server-0.log";   // stdout and stderr, appended
//   options.name = "server 0";
//   options.echo = true;                        // also "[server 0] line" on our stdout
//   ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Process> p, Process::Start(options));
//   p->Terminate();                             // SIGTERM, then SIGKILL after a grace
//
// Output: with a log_path or echo, the child's stdout and stderr go into one pipe that a
// thread of this process reads, so the two streams keep their order. stderr_path sends
// stderr to a file of its own instead. With neither, the child shares our stdout/stderr.
//
// Exit codes: the child's exit status, or 128 + N when signal N ended it (as a shell says).
//
// Thread safety: a Process is used by one thread at a time. Echoed lines of all
// processes are printed whole, one at a time.
#ifndef ONEBIT_COMMON_SUBPROCESS_H_
#define ONEBIT_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace onebit {

struct ProcessOptions {
  // argv[0] is the binary's path; PATH is not searched.
  std::vector<std::string> argv;
  // In messages and as the echo label; argv[0] when empty.
  std::string name;
  // Print every output line on this process's stdout as "[name] line".
  bool echo = false;
  // stdout and stderr (or stdout alone, with stderr_path) are appended here, whole lines
  // (a last line without a newline gets one). Empty: kept nowhere (unless echoed).
  std::string log_path;
  // stderr appended to this file instead, apart from stdout.
  std::string stderr_path;
  // The child's environment is ours without the variables named in env_unset, with the
  // "NAME=value" entries of env_set added (replacing a variable of the same name).
  std::vector<std::string> env_set;
  std::vector<std::string> env_unset;
  // The child's working directory; empty: ours. Relative paths above (log_path,
  // stderr_path, argv[0]) are relative to ours, not to this one.
  std::string working_dir;
};

class Process {
 public:
  // Starts the child in a process group of its own (a terminal's ^C reaches only us, and
  // we decide how children stop). A binary that cannot be run (missing, not executable)
  // or a log file that cannot be opened is an error here, naming the path.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const ProcessOptions& options);
  ~Process();  // Terminate(2 s) if it still runs

  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  // Sends `sig` (e.g. SIGSTOP, SIGCONT, SIGKILL); nothing once the child is reaped, so a
  // reused pid is never signalled.
  void Signal(int sig);
  // Sends SIGTERM (and SIGCONT, so that a stopped child sees it), then SIGKILL if it has
  // not exited after `grace`; returns once it is reaped. Nothing if it has exited.
  void Terminate(absl::Duration grace = absl::Seconds(5));
  // Waits up to `timeout` for the exit and returns the exit code, or DEADLINE_EXCEEDED
  // (the child keeps running).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Non-blocking: whether it has exited, and then its exit code in *code (if not null).
  //
  // Once this (or Wait) reports the exit, everything the child wrote is in the log:
  // the pipe is read to its end first. A grandchild that holds the pipe open delays this
  // by at most a second; what it writes later is lost.
  bool Exited(int* code);

 private:
  Process(std::string name, pid_t pid, int out_fd, int log_fd, bool echo);
  void Pump(int out_fd, int log_fd, bool echo);
  void FinishOutput();

  const std::string name_;
  const pid_t pid_;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::thread pump_;                  // reads the pipe, when there is one
  std::atomic<bool> stop_pump_{false};
  absl::Notification pump_at_eof_;
};

// Waits until `path` exists and is non-empty (written atomically by its producer) and
// returns its contents; DEADLINE_EXCEEDED after `timeout`, or FAILED_PRECONDITION as soon
// as `watch` (if given) has exited.
absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout,
                                        Process* watch = nullptr);

// Waits until the text of `path` (a log that grows) matches the regular expression
// `pattern` (ECMAScript) and returns its first group (the whole match if it has none):
// how a test learns the port a child bound to port 0 said it listens on. Errors as
// WaitForFile's (the exit is noticed after a last read of the log), with the log's end.
absl::StatusOr<std::string> WaitForLogMatch(const std::string& path, const std::string& pattern,
                                            absl::Duration timeout, Process* watch = nullptr);

}  // namespace onebit

#endif  // ONEBIT_COMMON_SUBPROCESS_H_
