// Test doubles for the wrappers of an Exchange (ForwardingExchange, FaultExchange):
// BareExchange implements only what every Exchange must (and fails those calls), so the
// base class's defaults show; RecordingExchange adds the sharded-state calls, records
// each with its arguments, and answers with values the test can recognise.
#ifndef ONEBIT_WORKER_EXCHANGE_RECORDING_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_RECORDING_EXCHANGE_H_

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/exchange/exchange.h"

namespace onebit {

class BareExchange : public Exchange {
 public:
  int world_size() const override { return 1; }
  absl::StatusOr<const float*> SumGradients(int64_t, const float*) override {
    return absl::UnimplementedError("bare");
  }
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t, const float*, const float*,
                                                   float) override {
    return absl::UnimplementedError("bare");
  }
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t, const float*) override {
    return absl::UnimplementedError("bare");
  }
  absl::Status ResetErrors(int64_t) override { return absl::UnimplementedError("bare"); }
  absl::StatusOr<bool> AnyOverflow(int64_t, bool) override {
    return absl::UnimplementedError("bare");
  }
  WorkerCompressor& worker_compressor() override { std::abort(); }  // not used by the tests
  uint64_t bytes_sent() const override { return 0; }
  uint64_t bytes_received() const override { return 0; }
};

class RecordingExchange : public BareExchange {
 public:
  // One call as it arrived: its name and arguments (null / -1 / 0 where it has none).
  struct Call {
    std::string name;
    int64_t step = -1;
    const void* first = nullptr;   // grad, m_shard, x or whole
    const void* second = nullptr;  // g
    float beta1 = 0.0f;
    float g_scale = 0.0f;
    std::vector<double> partials;
    size_t element_bytes = 0;  // AllGatherShardBytes'
    kernels::WireDtype dtype = kernels::WireDtype::kFp32;  // the gradient's (grad, g or x)
  };

  // What it answers: state_shard() and buffer_bytes() return these; the pointer calls
  // return their first argument plus one element; the result calls return `result` with
  // chunk = step; GatherPartials returns its argument twice.
  StateShard shard{10, 20, 16, 1, 2, 0, 3};
  uint64_t bytes = 12345;
  float rows[4] = {};

  std::vector<Call> calls;

  std::optional<StateShard> state_shard() const override { return shard; }
  absl::StatusOr<const float*> SumGradientsOfShard(int64_t step, Gradient grad) override {
    calls.push_back({"SumGradientsOfShard", step, grad.data});
    calls.back().dtype = grad.dtype;
    return static_cast<const float*>(grad.data) + 1;
  }
  absl::StatusOr<CompressedResult> AverageMomentumOfShard(int64_t step, const float* m_shard,
                                                          Gradient g, float beta1,
                                                          float g_scale) override {
    calls.push_back({"AverageMomentumOfShard", step, m_shard, g.data, beta1, g_scale});
    calls.back().dtype = g.dtype;
    return Result(step);
  }
  absl::StatusOr<float*> ShardRows(int64_t step, Gradient x, float scale) override {
    calls.push_back({"ShardRows", step, x.data});
    calls.back().g_scale = scale;
    calls.back().dtype = x.dtype;
    return rows;
  }
  absl::StatusOr<CompressedResult> CompressedAverageOfRows(int64_t step) override {
    calls.push_back({"CompressedAverageOfRows", step});
    return Result(step);
  }
  absl::Status AllGatherShards(float* whole) override {
    calls.push_back({"AllGatherShards", -1, whole});
    return absl::OkStatus();
  }
  absl::Status AllGatherShardBytes(void* whole, size_t element_bytes) override {
    calls.push_back({"AllGatherShardBytes", -1, whole});
    calls.back().element_bytes = element_bytes;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<double>> GatherPartials(const std::vector<double>& mine) override {
    calls.push_back({"GatherPartials"});
    calls.back().partials = mine;
    std::vector<double> both = mine;
    both.insert(both.end(), mine.begin(), mine.end());
    return both;
  }
  uint64_t buffer_bytes() const override { return bytes; }

 private:
  CompressedResult Result(int64_t step) const {
    CompressedResult r;
    r.exact = rows;
    r.chunk = static_cast<size_t>(step);
    return r;
  }
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_RECORDING_EXCHANGE_H_
