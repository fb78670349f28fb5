#include "common/fault.h"

#include <sys/wait.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(FaultTest, Parses) {
  EXPECT_FALSE(ParseFault("", {"a"})->has_value());
  absl::StatusOr<std::optional<Fault>> f = ParseFault("kill_at_step:12", {"kill_at_step"});
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->At("kill_at_step", 12));
  EXPECT_FALSE((*f)->At("kill_at_step", 11));
  for (const char* bad : {"kill_at_step", "kill_at_step:0", "kill_at_step:x", "other:3", ":3"}) {
    EXPECT_EQ(ParseFault(bad, {"kill_at_step"}).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(FaultTest, KillSelfDiesOfSigkill) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) KillSelf("child", "the test");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

}  // namespace
}  // namespace onebit
