#include "common/parallel.h"

#include <atomic>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace onebit {
namespace {

// Every task runs exactly once, for every pool size and task count, over many rounds (a
// thread that wakes late must never run a task of a finished round).
TEST(ParallelForTest, EveryTaskRunsOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ParallelFor pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t tasks : {0, 1, 2, 7, 64, 1000}) {
      for (int round = 0; round < 50; ++round) {
        std::vector<std::atomic<int>> hits(tasks);
        pool.Run(tasks, [&](size_t t) { hits[t].fetch_add(1); });
        for (size_t t = 0; t < tasks; ++t) {
          ASSERT_EQ(hits[t].load(), 1) << "threads " << threads << " tasks " << tasks
                                       << " round " << round << " task " << t;
        }
      }
    }
  }
}

// The pool really runs tasks on more than one thread when it has them: two tasks that wait
// for each other finish only if they run at the same time.
TEST(ParallelForTest, TasksRunConcurrently) {
  ParallelFor pool(2);
  std::atomic<int> arrived{0};
  pool.Run(2, [&](size_t) {
    arrived.fetch_add(1);
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(arrived.load(), 2);
}

// Partial results combined in task order give the same bits whatever the thread count.
TEST(ParallelForTest, FixedSplitGivesTheSameSumForAnyThreadCount) {
  std::vector<float> x(100003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f / static_cast<float>(i + 1);
  constexpr size_t kBlock = 4096;
  const size_t blocks = (x.size() + kBlock - 1) / kBlock;
  auto sum = [&](int threads) {
    ParallelFor pool(threads);
    std::vector<double> part(blocks);
    pool.Run(blocks, [&](size_t b) {
      double s = 0;
      for (size_t i = b * kBlock; i < std::min(x.size(), (b + 1) * kBlock); ++i) s += x[i];
      part[b] = s;
    });
    return std::accumulate(part.begin(), part.end(), 0.0);
  };
  const double one = sum(1);
  for (int threads : {2, 3, 5}) EXPECT_EQ(sum(threads), one) << threads;
}

TEST(ParallelForTest, UsableCpusIsPositive) {
  const int cpus = UsableCpus();
  EXPECT_GE(cpus, 1);
  EXPECT_LE(cpus, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace onebit
