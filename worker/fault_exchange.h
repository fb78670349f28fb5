// An Exchange that kills its process (SIGKILL) when step `step` enters the exchange, then
// nothing: the recovery tests' "mid-exchange" fault (--fault=kill_in_exchange:STEP). The
// other workers are inside that step's collective by then, so they see a peer vanish in
// the middle of it. Everything else is forwarded to the wrapped exchange.
#ifndef ONEBIT_WORKER_FAULT_EXCHANGE_H_
#define ONEBIT_WORKER_FAULT_EXCHANGE_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/fault.h"
#include "worker/exchange/exchange.h"

namespace onebit {

class FaultExchange final : public Exchange {
 public:
  FaultExchange(Exchange* inner, int64_t step, std::string who)
      : inner_(inner), step_(step), who_(std::move(who)) {}

  int world_size() const override { return inner_->world_size(); }
  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override {
    MaybeDie(step);
    return inner_->SumGradients(step, grad);
  }
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override {
    MaybeDie(step);
    return inner_->AverageMomentum(step, m, g, beta1);
  }
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override {
    MaybeDie(step);
    return inner_->CompressedAverage(step, x);
  }
  absl::Status ResetErrors(int64_t step) override { return inner_->ResetErrors(step); }
  absl::StatusOr<bool> AnyOverflow(int64_t step, bool local_overflow) override {
    return inner_->AnyOverflow(step, local_overflow);
  }
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

 private:
  void MaybeDie(int64_t step) {
    if (step == step_) KillSelf(who_, absl::StrCat("the exchange of step ", step));
  }

  Exchange* const inner_;
  const int64_t step_;
  const std::string who_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_FAULT_EXCHANGE_H_
