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
#include "worker/exchange/forwarding_exchange.h"

namespace onebit {

class FaultExchange final : public ForwardingExchange {
 public:
  FaultExchange(Exchange* inner, int64_t step, std::string who)
      : ForwardingExchange(inner), step_(step), who_(std::move(who)) {}

  absl::StatusOr<const float*> SumGradients(int64_t step, const float* grad) override {
    MaybeDie(step);
    return ForwardingExchange::SumGradients(step, grad);
  }
  absl::StatusOr<CompressedResult> AverageMomentum(int64_t step, const float* m, const float* g,
                                                   float beta1) override {
    MaybeDie(step);
    return ForwardingExchange::AverageMomentum(step, m, g, beta1);
  }
  absl::StatusOr<CompressedResult> CompressedAverage(int64_t step, const float* x) override {
    MaybeDie(step);
    return ForwardingExchange::CompressedAverage(step, x);
  }
  // The sharded calls that open a step's exchange (the LAMB rows: ShardRows, before
  // CompressedAverageOfRows).
  absl::StatusOr<const float*> SumGradientsOfShard(int64_t step, Gradient grad) override {
    MaybeDie(step);
    return ForwardingExchange::SumGradientsOfShard(step, grad);
  }
  absl::StatusOr<CompressedResult> AverageMomentumOfShard(int64_t step, const float* m_shard,
                                                          Gradient g, float beta1,
                                                          float g_scale) override {
    MaybeDie(step);
    return ForwardingExchange::AverageMomentumOfShard(step, m_shard, g, beta1, g_scale);
  }
  absl::StatusOr<float*> ShardRows(int64_t step, Gradient x, float scale) override {
    MaybeDie(step);
    return ForwardingExchange::ShardRows(step, x, scale);
  }

 private:
  void MaybeDie(int64_t step) {
    if (step == step_) KillSelf(who_, absl::StrCat("the exchange of step ", step));
  }

  const int64_t step_;
  const std::string who_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_FAULT_EXCHANGE_H_
