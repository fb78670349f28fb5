// What the sharded-state tests share: a job of nodes x local workers (threads) over a
// HierarchicalExchange that shards the optimizer state or not, their gradient stream,
// bitwise comparisons, and a worker's checkpoint of its state range.
#ifndef ONEBIT_WORKER_OPTIM_SHARDED_TEST_UTIL_H_
#define ONEBIT_WORKER_OPTIM_SHARDED_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optimizer.h"

namespace onebit::sharded_test {

// Runs `body` on nodes x local workers, in-process, each with its own CPU backend and a
// HierarchicalExchange over n elements with the codec named `codec`, sharding the state
// when `shard`. `worker` is node * local + local rank. Returns the first failure (an unknown
// codec included).
absl::Status RunJob(int nodes, int local, size_t n, const std::string& codec, bool shard,
                    const std::function<absl::Status(int worker, kernels::Backend* backend,
                                                     Exchange* exchange)>& body);

// test_stream::Grad with element i zeroed for i = first, first + every, ...: elements that
// never see a gradient, for the automatic mask.
std::vector<float> GradientWithZeros(int worker, int64_t step, size_t n, size_t first,
                                     size_t every);

// Whether `sharded` and `whole` hold `steps` parameter vectors of n elements each (one per
// step), `sharded`'s the same bits as `whole`'s at every step.
::testing::AssertionResult SameParamsEveryStep(const std::vector<std::vector<float>>& sharded,
                                               const std::vector<std::vector<float>>& whole,
                                               size_t n, int64_t steps);

// Whether `range`, a sharded worker's tensor over its state range from `begin`, is the
// unsharded worker's `whole` (n elements) there, bit for bit (== would pass -0.0 for 0.0).
// An empty range (an all-padding slice, data() maybe null) is never read.
::testing::AssertionResult SameOverRange(const std::vector<float>& range, size_t begin,
                                         const std::vector<float>& whole, size_t n);

// One worker's checkpoint: its tensors over its state range, its scalars, its errors.
struct Saved {
  StateTensors tensors;
  StateScalars scalars;
  ErrorState errors;
};
absl::StatusOr<Saved> Save(Optimizer& o);
// Restores `saved` at `step` (Optimizer::Restore, then the exchange's errors).
absl::Status Restore(Optimizer& o, int64_t step, int64_t freeze_step, const Saved& saved);

}  // namespace onebit::sharded_test

#endif  // ONEBIT_WORKER_OPTIM_SHARDED_TEST_UTIL_H_
