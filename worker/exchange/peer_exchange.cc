#include "worker/exchange/peer_exchange.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<PeerExchange>> PeerExchange::Create(
    kernels::Backend* backend, Transport* transport, size_t n,
    const ExactAllreduceOptions& exact, const Codec& codec) {
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *transport));
  std::unique_ptr<PeerExchange> e(new PeerExchange(backend, transport, n, exact));
  ONEBIT_ASSIGN_OR_RETURN(e->exact_, ExactAllreduce::Create(backend, transport, n, exact));
  ONEBIT_ASSIGN_OR_RETURN(e->compressed_,
                          CompressedAllreduce::Create(backend, transport, n, codec));
  return e;
}

PeerExchange::PeerExchange(kernels::Backend* backend, Transport* transport, size_t n,
                           const ExactAllreduceOptions& exact)
    : backend_(backend),
      transport_(transport),
      overlap_(std::make_unique<OverlappedWarmup>(backend, transport, n, exact)) {}

absl::StatusOr<const float*> PeerExchange::SumGradients(int64_t step, const float* grad) {
  if (overlap_->open()) return overlap_->Finish(step, grad);
  ONEBIT_RETURN_IF_ERROR(exact_->Run(grad));
  return exact_->result();
}

absl::StatusOr<CompressedResult> PeerExchange::AverageMomentum(int64_t /*step*/, const float* m,
                                                               const float* g, float beta1) {
  ONEBIT_RETURN_IF_ERROR(compressed_->RunMomentum(m, g, beta1));
  return CompressedResult{&compressed_->codec(), compressed_->result_blocks(),
                          compressed_->num_chunks(), compressed_->chunk()};
}

absl::StatusOr<CompressedResult> PeerExchange::CompressedAverage(int64_t step, const float* x) {
  // Without a gradient the compressor takes its input as it is.
  return AverageMomentum(step, x, nullptr, 0.0f);
}

absl::Status PeerExchange::ResetErrors(int64_t /*step*/) {
  ONEBIT_RETURN_IF_ERROR(compressed_->mutable_worker().ResetError());
  return compressed_->mutable_server().ResetError();
}

absl::StatusOr<bool> PeerExchange::AnyOverflow(int64_t /*step*/, bool local_overflow) {
  return AnyAcrossRanks(transport_, backend_, &flag_, local_overflow);
}

absl::StatusOr<ErrorState> PeerExchange::SaveErrors() {
  ONEBIT_ASSIGN_OR_RETURN(ErrorState state, Exchange::SaveErrors());
  ONEBIT_ASSIGN_OR_RETURN(state["server_error"], compressed_->server().error().ToHost());
  return state;
}

absl::Status PeerExchange::RestoreErrors(const ErrorState& state) {
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<float>* server, FindError(state, "server_error"));
  if (server->size() != compressed_->server().chunk()) {
    return absl::InvalidArgumentError(absl::StrCat("server_error has ", server->size(),
                                                   " elements, this rank's chunk ",
                                                   compressed_->server().chunk()));
  }
  ONEBIT_RETURN_IF_ERROR(Exchange::RestoreErrors(state));
  return compressed_->mutable_server().RestoreError(*server);
}

}  // namespace onebit
