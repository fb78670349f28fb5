#include "server/overflow_votes.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace onebit::server {
namespace {

const auto kNever = [] { return false; };

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// Each worker votes on each step from its own thread; returns answers[worker][step].
std::vector<std::vector<int>> VoteAll(OverflowVotes& votes, int workers,
                                      const std::vector<std::vector<bool>>& overflow) {
  std::vector<std::vector<int>> answers(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (size_t t = 0; t < overflow.size(); ++t) {
        absl::StatusOr<bool> any = votes.Vote(w, 2 * t + 1, overflow[t][w], Soon(), kNever);
        answers[w].push_back(any.ok() ? int{*any} : -1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return answers;
}

TEST(OverflowVotesTest, EveryWorkerGetsWhetherAnyOverflowed) {
  OverflowVotes votes(3);
  // Steps 1, 3, 5, 7 (gaps are fine): nobody, worker 2, workers 0 and 1, nobody.
  const std::vector<std::vector<bool>> overflow = {
      {false, false, false}, {false, false, true}, {true, true, false}, {false, false, false}};
  std::vector<std::vector<int>> answers = VoteAll(votes, 3, overflow);
  for (int w = 0; w < 3; ++w) EXPECT_EQ(answers[w], (std::vector<int>{0, 1, 1, 0})) << w;
}

TEST(OverflowVotesTest, ARetryGetsTheSameAnswerAndAChangedVoteIsRefused) {
  OverflowVotes votes(2);
  std::thread other([&] { ASSERT_TRUE(votes.Vote(1, 4, true, Soon(), kNever).ok()); });
  absl::StatusOr<bool> first = votes.Vote(0, 4, false, Soon(), kNever);
  other.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  absl::StatusOr<bool> again = votes.Vote(0, 4, false, Soon(), kNever);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again);
  absl::StatusOr<bool> changed = votes.Vote(0, 4, true, Soon(), kNever);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kAlreadyExists) << changed.status();
}

TEST(OverflowVotesTest, BadVotesAreRefusedAndChangeNothing) {
  OverflowVotes votes(2, /*retained_steps=*/2);
  EXPECT_EQ(votes.Vote(2, 1, false, Soon(), kNever).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(votes.Vote(-1, 1, false, Soon(), kNever).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(votes.Vote(0, 0, false, Soon(), kNever).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Decide steps 1..4; step 1 and 2 are then forgotten.
  VoteAll(votes, 2, std::vector<std::vector<bool>>(1, {false, false}));  // step 1
  for (int64_t t = 2; t <= 4; ++t) {
    std::thread other([&] { ASSERT_TRUE(votes.Vote(1, t, false, Soon(), kNever).ok()); });
    ASSERT_TRUE(votes.Vote(0, t, false, Soon(), kNever).ok());
    other.join();
  }
  EXPECT_EQ(votes.Vote(0, 1, false, Soon(), kNever).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A worker that voted on an open step cannot go back to an earlier one.
  const absl::Time now = absl::Now();
  EXPECT_EQ(votes.Vote(0, 9, false, now, kNever).status().code(),
            absl::StatusCode::kUnavailable);  // recorded, then gave up waiting
  EXPECT_EQ(votes.Vote(0, 7, false, now, kNever).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The missing worker's vote still completes step 9 for worker 0's retry.
  std::thread other([&] { EXPECT_TRUE(votes.Vote(1, 9, false, Soon(), kNever).ok()); });
  absl::StatusOr<bool> retry = votes.Vote(0, 9, false, Soon(), kNever);
  other.join();
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_FALSE(*retry);
}

TEST(OverflowVotesTest, AMissingWorkerIsNamedAtTheDeadlineOrWhenTheCallerLeaves) {
  OverflowVotes votes(3);
  std::thread other([&] { (void)votes.Vote(2, 1, false, absl::Now() + absl::Seconds(1), kNever); });
  absl::StatusOr<bool> any =
      votes.Vote(0, 1, false, absl::Now() + absl::Milliseconds(300), kNever);
  other.join();
  ASSERT_EQ(any.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(any.status().message().find("worker(s) 1"), std::string::npos) << any.status();

  std::atomic<bool> gone{false};
  std::thread leave([&] {
    absl::SleepFor(absl::Milliseconds(100));
    gone = true;
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<bool> cancelled =
      votes.Vote(0, 2, false, absl::InfiniteFuture(), [&] { return gone.load(); });
  leave.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace onebit::server
