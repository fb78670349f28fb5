#include "server/result_pacer.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace onebit::server {
namespace {

bool Never() { return false; }

// W workers as threads, started in the reverse of the order they must write in; each
// writes (records itself) once it has its turn. Two steps in a row.
TEST(ResultPacerTest, WritesGoOneAtATimeInTheRotatedOrder) {
  constexpr int kW = 5;
  ResultPacer pacer(kW, /*first_worker=*/2, absl::Seconds(30));
  for (int64_t step = 7; step <= 8; ++step) {
    absl::Mutex mu;
    std::vector<int> order;
    std::atomic<int> writing{0};
    std::atomic<bool> overlapped{false};
    std::vector<std::thread> threads;
    for (int k = kW - 1; k >= 0; --k) {
      const int worker = (2 + k) % kW;
      threads.emplace_back([&, worker] {
        EXPECT_TRUE(pacer.AwaitTurn(step, worker, Never));
        if (writing.fetch_add(1) != 0) overlapped = true;
        absl::SleepFor(absl::Milliseconds(5));  // the write
        {
          absl::MutexLock lock(&mu);
          order.push_back(worker);
        }
        writing.fetch_sub(1);
        pacer.Done(step, worker);
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(order, (std::vector<int>{2, 3, 4, 0, 1})) << "step " << step;
    EXPECT_FALSE(overlapped) << "two writes at once";
  }
}

TEST(ResultPacerTest, AWorkerThatNeverWritesDelaysTheNextByMaxWaitOnly) {
  ResultPacer pacer(3, 0, absl::Milliseconds(200));
  // Worker 0 is first and never calls Done; worker 1 waits 200 ms, then goes (not its turn).
  const absl::Time start = absl::Now();
  EXPECT_FALSE(pacer.AwaitTurn(1, 1, Never));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(190));
  EXPECT_LT(waited, absl::Seconds(5));
  // Once 0 and 1 are done, 2 goes at once.
  pacer.Done(1, 1);
  pacer.Done(1, 0);
  const absl::Time again = absl::Now();
  EXPECT_TRUE(pacer.AwaitTurn(1, 2, Never));
  EXPECT_LT(absl::Now() - again, absl::Milliseconds(100));
}

TEST(ResultPacerTest, ACancelledStreamStopsWaiting) {
  ResultPacer pacer(2, 0, absl::Seconds(30));
  std::atomic<bool> gone{false};
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(100));
    gone = true;
  });
  const absl::Time start = absl::Now();
  EXPECT_FALSE(pacer.AwaitTurn(4, 1, [&] { return gone.load(); }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  cancel.join();
}

TEST(ResultPacerTest, AnOlderStepAndTheFirstInOrderGoAtOnce) {
  ResultPacer pacer(4, 3, absl::Seconds(30));
  EXPECT_TRUE(pacer.AwaitTurn(10, 3, Never));  // first in order
  // Step 9 (a retry after step 10 opened) is not paced; nor is a Done of it counted.
  EXPECT_TRUE(pacer.AwaitTurn(9, 2, Never));
  pacer.Done(9, 3);
  pacer.Done(10, 3);
  EXPECT_TRUE(pacer.AwaitTurn(10, 0, Never));  // second in order, after 3
  // A worker number outside [0, W) is taken mod W rather than trusted as an index.
  pacer.Done(10, 4);  // = worker 0
  EXPECT_TRUE(pacer.AwaitTurn(10, 1, Never));
}

}  // namespace
}  // namespace onebit::server
