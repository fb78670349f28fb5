#include "common/signals.h"

#include <sys/socket.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>

#include "gtest/gtest.h"

namespace onebit {
namespace {

// The test main (common/gtest_main.cc) ignores SIGPIPE, as every binary's main does:
// writing to a socket whose peer is gone must fail with EPIPE instead of killing the
// process (exit 141).
TEST(SignalsTest, WriteToVanishedPeerIsAnErrorNotADeath) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);
  char byte = 1;
  errno = 0;
  EXPECT_EQ(write(fds[0], &byte, 1), -1);  // plain write(): no MSG_NOSIGNAL
  EXPECT_EQ(errno, EPIPE);
  close(fds[0]);
}

TEST(SignalsTest, IgnoreSigpipeIsIdempotent) {
  IgnoreSigpipe();
  IgnoreSigpipe();
  struct sigaction current;
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

// SIGTERM sent to the process is taken by the watcher's thread, whatever the main thread
// does: the callback runs once, Wait() returns the signal; a second signal is absorbed.
TEST(SignalsTest, TerminationWatcherTakesSigtermOnItsThread) {
  std::atomic<int> calls{0};
  std::atomic<int> seen{0};
  const std::thread::id main_thread = std::this_thread::get_id();
  std::atomic<bool> on_other_thread{false};
  {
    TerminationWatcher watcher([&](int sig) {
      seen = sig;
      on_other_thread = std::this_thread::get_id() != main_thread;
      ++calls;
    });
    EXPECT_EQ(watcher.received(), 0);
    ASSERT_EQ(kill(getpid(), SIGTERM), 0);
    EXPECT_EQ(watcher.Wait(), SIGTERM);
    EXPECT_EQ(watcher.received(), SIGTERM);
    ASSERT_EQ(kill(getpid(), SIGINT), 0);  // still blocked and taken: no death
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(watcher.Wait(), SIGTERM);
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen.load(), SIGTERM);
  EXPECT_TRUE(on_other_thread.load());
}

TEST(SignalsTest, TerminationWatcherStopsWithoutASignal) {
  const auto start = std::chrono::steady_clock::now();
  { TerminationWatcher watcher; }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace onebit
