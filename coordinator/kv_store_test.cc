#include "coordinator/kv_store.h"

#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

TEST(KvStoreTest, SetThenGet) {
  KvStore kv;
  EXPECT_FALSE(kv.Get("a", absl::ZeroDuration())->has_value());
  ASSERT_TRUE(kv.Set("a", std::string("x\0y", 3)).ok());
  EXPECT_EQ(kv.Get("a", absl::ZeroDuration())->value(), std::string("x\0y", 3));
  ASSERT_TRUE(kv.Set("empty", "").ok());
  EXPECT_EQ(kv.Get("empty", absl::Seconds(1))->value(), "");
}

TEST(KvStoreTest, KeysAreWrittenOnce) {
  KvStore kv;
  ASSERT_TRUE(kv.Set("a", "1").ok());
  EXPECT_TRUE(kv.Set("a", "1").ok());  // a retry
  absl::Status s = kv.Set("a", "2");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
  EXPECT_EQ(kv.Get("a", absl::ZeroDuration())->value(), "1");
}

TEST(KvStoreTest, WaitingGetWakesWhenTheKeyIsSet) {
  KvStore kv;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(kv.Set("k", "v").ok());
  });
  absl::StatusOr<std::optional<std::string>> got = kv.Get("k", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->value(), "v");
}

TEST(KvStoreTest, WaitingGetTimesOutAtItsOwnDeadlineOrTheStoreBound) {
  KvLimits limits;
  limits.max_wait = absl::Milliseconds(50);
  KvStore kv(limits);
  const absl::Time start = absl::Now();
  absl::Status s = kv.Get("k", absl::Hours(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("'k' was not set within 50ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(KvStoreTest, ShutdownWakesWaiters) {
  KvStore kv;
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    kv.Shutdown();
  });
  EXPECT_EQ(kv.Get("k", absl::Seconds(20)).status().code(), absl::StatusCode::kUnavailable);
  closer.join();
}

TEST(KvStoreTest, LimitsAreEnforcedWithoutStateChange) {
  KvLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_keys = 2;
  limits.max_total_bytes = 30;
  KvStore kv(limits);
  EXPECT_EQ(kv.Set("", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("123456789", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Get("123456789", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(kv.Set("k", std::string(17, 'v')).message(), HasSubstr("limit is 16"));
  ASSERT_TRUE(kv.Set("a", std::string(16, 'v')).ok());  // 17 bytes
  EXPECT_EQ(kv.Set("b", std::string(16, 'v')).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Set("b", "v").ok());
  EXPECT_EQ(kv.Set("c", "v").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.size(), 2u);
}

TEST(KvStoreTest, BinaryKeysAreEscapedInErrors) {
  KvStore kv;
  ASSERT_TRUE(kv.Set(std::string("\x01k", 2), "1").ok());
  EXPECT_THAT(kv.Set(std::string("\x01k", 2), "2").message(), HasSubstr("\\x01k"));
}

}  // namespace
}  // namespace onebit
