// ForwardingExchange: an Exchange that passes every call to another one. A wrapper that
// changes a few calls (FaultExchange) derives from it and overrides
// only those.
//
// Thread safety: as the wrapped exchange.
#ifndef ONEBIT_WORKER_EXCHANGE_FORWARDING_EXCHANGE_H_
#define ONEBIT_WORKER_EXCHANGE_FORWARDING_EXCHANGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "worker/exchange/exchange.h"

namespace onebit {

class ForwardingExchange : public Exchange {
 public:
  // `inner` is borrowed (a derived class may own it) and must outlive every call.
  explicit ForwardingExchange(Exchange* inner) : inner_(inner) {}

  int world_size() const override { return inner_->world_size(); }
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override {
    return inner_->SumGradients(step, grad);
  }
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override {
    return inner_->AverageMomentum(step, m, g, beta1);
  }
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override {
    return inner_->CompressedAverage(step, x);
  }
  absl::Status ResetErrors(int64_t step) override { return inner_->ResetErrors(step); }
  absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) override {
    return inner_->AnyOverflow(step, local_overflow);
  }
  size_t reduction_stride() const override { return inner_->reduction_stride(); }
  std::optional<StateShard> state_shard() const override { return inner_->state_shard(); }
  absl::StatusOr<const float*> SumGradientsOfShard(int64_t step, Gradient grad) override {
    return inner_->SumGradientsOfShard(step, grad);
  }
  absl::StatusOr<CompressedResult> AverageMomentumOfShard(int64_t step, const float* m_shard,
                                                          Gradient g, float beta1,
                                                          float g_scale) override {
    return inner_->AverageMomentumOfShard(step, m_shard, g, beta1, g_scale);
  }
  absl::StatusOr<float*> ShardRows(int64_t step, Gradient x, float scale) override {
    return inner_->ShardRows(step, x, scale);
  }
  absl::StatusOr<CompressedResult> CompressedAverageOfRows(int64_t step) override {
    return inner_->CompressedAverageOfRows(step);
  }
  absl::Status AllGatherShards(float* whole) override { return inner_->AllGatherShards(whole); }
  absl::Status AllGatherShardBytes(void* whole, size_t element_bytes) override {
    return inner_->AllGatherShardBytes(whole, element_bytes);
  }
  absl::StatusOr<std::vector<double>> GatherPartials(const std::vector<double>& mine) override {
    return inner_->GatherPartials(mine);
  }
  uint64_t buffer_bytes() const override { return inner_->buffer_bytes(); }
  WorkerCompressor& worker_compressor() override { return inner_->worker_compressor(); }
  absl::StatusOr<ErrorState> SaveErrors() override { return inner_->SaveErrors(); }
  absl::Status RestoreErrors(const ErrorState& state) override {
    return inner_->RestoreErrors(state);
  }
  void ScheduleCheckpoint(int64_t step) override { inner_->ScheduleCheckpoint(step); }
  uint64_t bytes_sent() const override { return inner_->bytes_sent(); }
  uint64_t bytes_received() const override { return inner_->bytes_received(); }
  LinkBytes intra_node_bytes() const override { return inner_->intra_node_bytes(); }
  LinkBytes inter_node_bytes() const override { return inner_->inter_node_bytes(); }
  double compress_seconds() const override { return inner_->compress_seconds(); }
  void set_step_clock(StepClock* clock) override {
    Exchange::set_step_clock(clock);
    inner_->set_step_clock(clock);
  }

 protected:
  Exchange* forwarded() const { return inner_; }

 private:
  Exchange* const inner_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_FORWARDING_EXCHANGE_H_
