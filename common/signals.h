// Process-wide signal set-up every onebit main (binaries and test mains) does first.
//
// SIGPIPE: a peer that vanishes while this process writes to its socket must surface as an
// EPIPE error from the write (and then a clear status from the transport), never kill the
// process. gloo, gRPC and cpp-httplib do not all pass MSG_NOSIGNAL on every send, so the
// signal is ignored for the whole process.
//
// SIGTERM and SIGINT (an orchestrator stopping a container, Ctrl-C): TerminationWatcher
// takes them on a thread of its own, so that a main blocked elsewhere (registering,
// training in a collective) still ends cleanly with the exit code it chooses.
#ifndef ONEBIT_COMMON_SIGNALS_H_
#define ONEBIT_COMMON_SIGNALS_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace onebit {

// Sets SIGPIPE to SIG_IGN. Idempotent; call it at the top of main().
void IgnoreSigpipe();

// Construct it at the top of main, before any other thread starts: it blocks SIGTERM and
// SIGINT in the calling thread, every thread started later inherits that mask, and its own
// thread alone takes them (sigtimedwait). When one arrives it runs `on_signal(signal)` on
// that thread (once; it may end the process), then wakes Wait(). Later signals are taken
// and ignored until destruction. The destructor stops the thread; the signals stay blocked
// (pending ones are then never delivered).
// Thread safety: Wait(), received() from any thread.
class TerminationWatcher {
 public:
  explicit TerminationWatcher(std::function<void(int signal)> on_signal = nullptr);
  ~TerminationWatcher();
  TerminationWatcher(const TerminationWatcher&) = delete;
  TerminationWatcher& operator=(const TerminationWatcher&) = delete;

  // Blocks until SIGTERM or SIGINT arrived (and on_signal returned); returns it.
  int Wait();
  // The signal taken so far, or 0.
  int received() const { return received_.load(); }

 private:
  void Run();

  const std::function<void(int)> on_signal_;
  std::atomic<int> received_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable woken_;
  bool handled_ = false;  // guarded by mu_: on_signal_ returned
  std::thread thread_;
};

}  // namespace onebit

#endif  // ONEBIT_COMMON_SIGNALS_H_
