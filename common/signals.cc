#include "common/signals.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <csignal>

namespace onebit {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void IgnoreSigpipe() { std::signal(SIGPIPE, SIG_IGN); }

TerminationWatcher::TerminationWatcher(std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)) {
  const sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this] { Run(); });
}

TerminationWatcher::~TerminationWatcher() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void TerminationWatcher::Run() {
  const sigset_t set = TerminationSignals();
  // A short timeout, so that the destructor's stop_ is seen without a signal of its own.
  const timespec poll = {0, 100 * 1000 * 1000};
  while (!stop_.load()) {
    const int sig = sigtimedwait(&set, nullptr, &poll);
    if (sig <= 0 || received_.load() != 0) continue;  // timeout, EINTR, or already handled
    received_.store(sig);
    if (on_signal_) on_signal_(sig);
    std::lock_guard<std::mutex> lock(mu_);
    handled_ = true;
    woken_.notify_all();
  }
}

int TerminationWatcher::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  woken_.wait(lock, [this] { return handled_; });
  return received_.load();
}

}  // namespace onebit
