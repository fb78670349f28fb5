#include "common/status_macros.h"
#include "gtest/gtest.h"
absl::StatusOr<int> F(bool ok) { if (!ok) return absl::InvalidArgumentError("x"); return 3; }
absl::Status G(bool ok) { ONEBIT_ASSIGN_OR_RETURN(int v, F(ok)); (void)v; return absl::OkStatus(); }
TEST(Macros, Work) { EXPECT_TRUE(G(true).ok()); EXPECT_EQ(G(false).code(), absl::StatusCode::kInvalidArgument); }
