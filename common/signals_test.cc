#include "common/signals.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace
}  // namespace onebit
