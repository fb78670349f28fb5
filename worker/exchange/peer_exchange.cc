#include "worker/exchange/peer_exchange.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<PeerExchange>> PeerExchange::Create(
    kernels::Backend* backend, Transport* transport, size_t n,
    const ExactAllreduceOptions& exact) {
  if (backend->memory_space() != transport->memory_space()) {
    return absl::InvalidArgumentError(absl::StrCat("backend ", backend->name(),
                                                   " and transport ", transport->name(),
                                                   " use different memory spaces"));
  }
  std::unique_ptr<PeerExchange> e(new PeerExchange(transport));
  ONEBIT_ASSIGN_OR_RETURN(e->exact_, ExactAllreduce::Create(backend, transport, n, exact));
  ONEBIT_ASSIGN_OR_RETURN(e->compressed_, CompressedAllreduce::Create(backend, transport, n));
  return e;
}

absl::StatusOr<const float*> PeerExchange::SumGradients(int64_t /*step*/, const float* grad) {
  ONEBIT_RETURN_IF_ERROR(exact_->Run(grad));
  return exact_->result();
}

absl::StatusOr<CompressedResult> PeerExchange::AverageMomentum(int64_t /*step*/, const float* m,
                                                               const float* g, float beta1) {
  ONEBIT_RETURN_IF_ERROR(compressed_->RunMomentum(m, g, beta1));
  return CompressedResult{compressed_->result_blocks(), compressed_->num_chunks(),
                          compressed_->chunk()};
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
