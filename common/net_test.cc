#include "common/net.h"

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(JoinHostPortTest, BracketsOnlyUnbracketedIpv6Literals) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", 80), "127.0.0.1:80");
  EXPECT_EQ(JoinHostPort("0.0.0.0", 0), "0.0.0.0:0");
  EXPECT_EQ(JoinHostPort("localhost", 80), "localhost:80");
  EXPECT_EQ(JoinHostPort("::1", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("fe80::1%eth0", 65535), "[fe80::1%eth0]:65535");
  // Already bracketed: not bracketed twice.
  EXPECT_EQ(JoinHostPort("[::1]", 80), "[::1]:80");
  EXPECT_EQ(JoinHostPort("[::]", 8080), "[::]:8080");
}

}  // namespace
}  // namespace onebit
