#include "worker/exchange/workers_warmup_exchange.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<WorkersWarmupExchange>> WorkersWarmupExchange::Create(
    kernels::Backend* backend, Transport* transport, size_t n,
    const ExactAllreduceOptions& exact, std::unique_ptr<Exchange> compressed) {
  if (compressed == nullptr) return absl::InvalidArgumentError("no exchange for the compressed stage");
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *transport));
  if (transport->world_size() != compressed->world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the warmup's transport has ", transport->world_size(),
                     " workers, the compressed exchange ", compressed->world_size()));
  }
  std::unique_ptr<WorkersWarmupExchange> e(
      new WorkersWarmupExchange(backend, transport, n, exact, std::move(compressed)));
  ONEBIT_ASSIGN_OR_RETURN(e->exact_, ExactAllreduce::Create(backend, transport, n, exact));
  return e;
}

absl::StatusOr<const float*> WorkersWarmupExchange::SumGradients(int64_t step,
                                                                 const float* grad) {
  if (overlap_->open()) return overlap_->Finish(step, grad);
  ONEBIT_RETURN_IF_ERROR(exact_->Run(grad));
  return exact_->result();
}

absl::StatusOr<bool> WorkersWarmupExchange::AnyOverflow(int64_t /*step*/, bool local_overflow) {
  return AnyAcrossRanks(transport_, backend_, &flag_, local_overflow);
}

uint64_t WorkersWarmupExchange::bytes_sent() const {
  return transport_->bytes_sent() + compressed_->bytes_sent();
}

uint64_t WorkersWarmupExchange::bytes_received() const {
  return transport_->bytes_received() + compressed_->bytes_received();
}

}  // namespace onebit
