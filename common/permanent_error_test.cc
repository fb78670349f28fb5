#include "common/permanent_error.h"

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

absl::Status Diverges() {
  return MarkPermanent(absl::FailedPreconditionError("training diverged: the loss is nan"), 48);
}

absl::Status Through() {
  ONEBIT_RETURN_IF_ERROR(Diverges());
  return absl::OkStatus();
}

absl::StatusOr<int> ThroughStatusOr() {
  ONEBIT_RETURN_IF_ERROR(Through());
  return 1;
}

TEST(PermanentErrorTest, TheMarkSurvivesReturnsAndStatusOr) {
  EXPECT_TRUE(IsPermanent(Diverges()));
  EXPECT_TRUE(IsPermanent(Through()));
  const absl::StatusOr<int> result = ThroughStatusOr();
  EXPECT_TRUE(IsPermanent(result.status()));
  EXPECT_EQ(result.status().message(), "training diverged: the loss is nan");
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PermanentErrorStep(result.status()), 48);
}

TEST(PermanentErrorTest, OtherErrorsAndOkAreNot) {
  EXPECT_FALSE(IsPermanent(absl::UnavailableError("a peer vanished")));
  EXPECT_FALSE(IsPermanent(absl::OkStatus()));
  EXPECT_FALSE(IsPermanent(MarkPermanent(absl::OkStatus())));
  EXPECT_TRUE(MarkPermanent(absl::OkStatus()).ok());
  EXPECT_EQ(PermanentErrorStep(absl::UnavailableError("a peer vanished")), 0);
  EXPECT_EQ(PermanentErrorStep(MarkPermanent(absl::InternalError("no step"))), 0);
  // A new status from the old message is a new error: the mark does not follow it.
  const absl::Status marked = Diverges();
  EXPECT_FALSE(IsPermanent(absl::InternalError(marked.message())));
}

}  // namespace
}  // namespace onebit
