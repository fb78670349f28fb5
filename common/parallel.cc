#include "common/parallel.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

namespace onebit {

ParallelFor::ParallelFor(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ParallelFor::~ParallelFor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

size_t ParallelFor::Drain() {
  size_t ran = 0;
  for (size_t t = next_.fetch_add(1); t < num_tasks_; t = next_.fetch_add(1)) {
    (*fn_)(t);
    ++ran;
  }
  return ran;
}

void ParallelFor::Run(size_t num_tasks, absl::FunctionRef<void(size_t)> fn) {
  if (workers_.empty() || num_tasks <= 1) {
    for (size_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_.store(0);
    done_ = 0;
    ++generation_;
  }
  start_cv_.notify_all();
  const size_t ran = Drain();
  std::unique_lock<std::mutex> lock(mu_);
  done_ += ran;
  done_cv_.wait(lock, [&] { return done_ == num_tasks_ && active_ == 0; });
  fn_ = nullptr;
}

void ParallelFor::WorkerLoop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (fn_ == nullptr) continue;  // woke after that job was over
    ++active_;
    lock.unlock();
    const size_t ran = Drain();
    lock.lock();
    done_ += ran;
    --active_;
    if (done_ == num_tasks_ && active_ == 0) done_cv_.notify_one();
  }
}

namespace {

// The CPU quota of this process's cgroup in CPUs (rounded up), or 0 if none is set.
int CgroupCpuLimit() {
  // cgroup v2: "max 100000" or "200000 100000" in the unified hierarchy.
  {
    std::ifstream f("/sys/fs/cgroup/cpu.max");
    std::string quota;
    double period = 0;
    if (f >> quota >> period && quota != "max" && period > 0) {
      const double q = std::atof(quota.c_str());
      if (q > 0) return static_cast<int>(std::ceil(q / period));
    }
  }
  // cgroup v1.
  std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
  std::ifstream p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
  double quota = -1, period = 0;
  if (q >> quota && p >> period && quota > 0 && period > 0) {
    return static_cast<int>(std::ceil(quota / period));
  }
  return 0;
}

}  // namespace

int UsableCpus() {
  int cpus = 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  if (cpus <= 0) cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int limit = CgroupCpuLimit();
  if (limit > 0) cpus = std::min(cpus, limit);
  return std::max(cpus, 1);
}

}  // namespace onebit
