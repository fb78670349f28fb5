// A small fixed pool of threads for data-parallel loops over host memory (the CPU kernels),
// and how many CPUs this process may really use.
//
//   ParallelFor pool(4);                        // the caller plus 3 threads
//   pool.Run(num_tasks, [&](size_t t) { ... }); // returns when every task has run
//
// Tasks are numbered; which thread runs which task varies from call to call, so callers
// make each task's result independent of that (a fixed split of the data, partial results
// combined in task order). Run() holds no lock while tasks run and takes no allocation.
//
// Thread safety: Run() may be called from one thread at a time (the owner's). The pool's
// threads live as long as the object.
#ifndef ONEBIT_COMMON_PARALLEL_H_
#define ONEBIT_COMMON_PARALLEL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace onebit {

class ParallelFor {
 public:
  // threads >= 1 in all, the calling thread included (1: Run() is a plain loop).
  explicit ParallelFor(int threads);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(0..num_tasks-1), each exactly once, on the caller and the pool's threads.
  void Run(size_t num_tasks, absl::FunctionRef<void(size_t)> fn);

 private:
  void WorkerLoop();
  // Takes tasks until none are left; returns how many it ran.
  size_t Drain();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // The current job, under mu_; fn_ is null between jobs, so a thread that wakes late
  // never joins a finished one.
  const absl::FunctionRef<void(size_t)>* fn_ = nullptr;
  size_t num_tasks_ = 0;
  std::atomic<size_t> next_{0};
  size_t done_ = 0;          // tasks finished (under mu_)
  int active_ = 0;           // pool threads inside the current job (under mu_)
  uint64_t generation_ = 0;  // one per Run()
  bool stop_ = false;
};

// CPUs this process may run on: its affinity mask, lowered by a cgroup CPU quota (v2
// cpu.max or v1 cpu.cfs_quota_us, rounded up) where one is set, as in a container with a
// CPU limit. At least 1.
int UsableCpus();

}  // namespace onebit

#endif  // ONEBIT_COMMON_PARALLEL_H_
