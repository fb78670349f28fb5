// Child processes for the local launcher: spawned with their output piped back and every
// line prefixed with the child's name, so the terminal shows one interleaved, labelled log.
//
// Thread safety: a Process is owned by one thread; the output threads only print.
#ifndef ONEBIT_DEPLOY_PROCESS_H_
#define ONEBIT_DEPLOY_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace onebit::launcher {

class Process {
 public:
  // Starts argv[0] with the rest as arguments. With `echo`, every output line is printed
  // as "[name] line"; without, output goes to `log_path` only (always written).
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::string& name,
                                                        const std::vector<std::string>& argv,
                                                        const std::string& log_path, bool echo);
  ~Process();  // kills the child if it still runs

  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }

  // Sends SIGTERM (then SIGKILL after `grace`) unless it has exited.
  void Terminate(absl::Duration grace = absl::Seconds(5));
  // Waits up to `timeout` for the exit; returns the exit code (128+signal when killed),
  // or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Non-blocking: the exit code if it has exited.
  bool Exited(int* code);

 private:
  Process(std::string name, pid_t pid, int out_fd) : name_(std::move(name)), pid_(pid), out_fd_(out_fd) {}
  void Pump(std::string log_path, bool echo);

  std::string name_;
  pid_t pid_;
  int out_fd_;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::thread pump_;
};

// Waits until `path` exists and is non-empty (written atomically by its producer) and
// returns its contents; DEADLINE_EXCEEDED after `timeout`, or an error as soon as `watch`
// (if given) has exited.
absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout,
                                        Process* watch = nullptr);

}  // namespace onebit::launcher

#endif  // ONEBIT_DEPLOY_PROCESS_H_
