#include "security/auth.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "security/test_certs.h"

namespace onebit::security {
namespace {

const std::string kAdmin = "admin-0123456789abcdef";
const std::string kMember = "member-0123456789abcdef";

std::string TmpFile(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(AuthorizeTest, NothingConfiguredIsOpen) {
  const Tokens none;
  EXPECT_TRUE(Authorize(none, Access::kAdmin, "", "Stop").ok());
  EXPECT_TRUE(Authorize(none, Access::kMember, "", "KvSet").ok());
  EXPECT_TRUE(Authorize(none, Access::kAdmin, "Bearer whatever", "Stop").ok());
}

TEST(AuthorizeTest, AdminCalls) {
  const Tokens tokens{kAdmin, kMember};
  EXPECT_TRUE(Authorize(tokens, Access::kAdmin, BearerValue(kAdmin), "Stop").ok());
  EXPECT_TRUE(Authorize(tokens, Access::kAdmin, "bearer " + kAdmin, "Stop").ok());
  const absl::Status none = Authorize(tokens, Access::kAdmin, "", "Stop");
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(none.message().find("Stop needs the admin token"), absl::string_view::npos) << none;
  const absl::Status wrong = Authorize(tokens, Access::kAdmin, BearerValue(kAdmin + "x"), "Stop");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong.message().find(kAdmin), absl::string_view::npos) << "never echo a token";
  EXPECT_EQ(Authorize(tokens, Access::kAdmin, "Basic " + kAdmin, "Stop").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authorize(tokens, Access::kAdmin, kAdmin, "Stop").code(),
            absl::StatusCode::kUnauthenticated);
  // A member is known, but not allowed.
  EXPECT_EQ(Authorize(tokens, Access::kAdmin, BearerValue(kMember), "Stop").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizeTest, MemberCalls) {
  const Tokens tokens{kAdmin, kMember};
  EXPECT_TRUE(Authorize(tokens, Access::kMember, BearerValue(kMember), "KvGet").ok());
  EXPECT_TRUE(Authorize(tokens, Access::kMember, BearerValue(kAdmin), "KvGet").ok());
  EXPECT_EQ(Authorize(tokens, Access::kMember, "", "KvGet").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authorize(tokens, Access::kMember, BearerValue("not-the-member-token"), "KvGet").code(),
            absl::StatusCode::kUnauthenticated);
  // Only an admin token: member calls stay open (to whom the transport admits).
  EXPECT_TRUE(Authorize(Tokens{kAdmin, ""}, Access::kMember, "", "KvGet").ok());
  // Only a member token: admin calls stay open too.
  EXPECT_TRUE(Authorize(Tokens{"", kMember}, Access::kAdmin, "", "Stop").ok());
}

TEST(AuthorizeTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(TokenFileTest, ReadsAndTrims) {
  const std::string path = TmpFile("token");
  ASSERT_TRUE(WriteTokenFile(path, "  " + kAdmin + "  ").ok());
  absl::StatusOr<std::string> token = ReadTokenFile(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kAdmin);
}

TEST(TokenFileTest, RejectsBadTokens) {
  EXPECT_EQ(ReadTokenFile(TmpFile("no-such-token")).status().code(), absl::StatusCode::kNotFound);
  const std::string short_path = TmpFile("short-token");
  ASSERT_TRUE(WriteTokenFile(short_path, "abc").ok());
  const absl::Status too_short = ReadTokenFile(short_path).status();
  EXPECT_EQ(too_short.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_short.message().find(short_path), absl::string_view::npos) << too_short;
  const std::string spaced = TmpFile("spaced-token");
  ASSERT_TRUE(WriteTokenFile(spaced, "0123456789 abcdef0123").ok());
  EXPECT_EQ(ReadTokenFile(spaced).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TokenFileTest, ResolvePrecedence) {
  const std::string flag_file = TmpFile("flag-token"), config_file = TmpFile("config-token");
  ASSERT_TRUE(WriteTokenFile(flag_file, "flag-0123456789abcdef").ok());
  ASSERT_TRUE(WriteTokenFile(config_file, "config-0123456789abcdef").ok());
  unsetenv("ONEBIT_TEST_TOKEN");
  EXPECT_EQ(*ResolveToken("", "ONEBIT_TEST_TOKEN", ""), "");
  EXPECT_EQ(*ResolveToken("", "ONEBIT_TEST_TOKEN", config_file), "config-0123456789abcdef");
  setenv("ONEBIT_TEST_TOKEN", "env-0123456789abcdef", 1);
  EXPECT_EQ(*ResolveToken("", "ONEBIT_TEST_TOKEN", config_file), "env-0123456789abcdef");
  EXPECT_EQ(*ResolveToken(flag_file, "ONEBIT_TEST_TOKEN", config_file), "flag-0123456789abcdef");
  setenv("ONEBIT_TEST_TOKEN", "short", 1);
  const absl::Status bad = ResolveToken("", "ONEBIT_TEST_TOKEN", "").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("$ONEBIT_TEST_TOKEN"), absl::string_view::npos) << bad;
  unsetenv("ONEBIT_TEST_TOKEN");
}

}  // namespace
}  // namespace onebit::security
