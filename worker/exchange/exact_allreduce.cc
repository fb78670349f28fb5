#include "worker/exchange/exact_allreduce.h"

#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<ExactAllreduce>> ExactAllreduce::Create(kernels::Backend* backend,
                                                                      Transport* transport,
                                                                      size_t n) {
  const size_t w = static_cast<size_t>(transport->world_size());
  const size_t chunk = (n + w - 1) / w;
  std::unique_ptr<ExactAllreduce> a(new ExactAllreduce(backend, transport, n, chunk));
  using kernels::Buffer;
  ONEBIT_ASSIGN_OR_RETURN(a->send_, Buffer<float>::Create(backend, w * chunk));
  ONEBIT_ASSIGN_OR_RETURN(a->received_, Buffer<float>::Create(backend, w * chunk));
  ONEBIT_ASSIGN_OR_RETURN(a->summed_, Buffer<float>::Create(backend, chunk));
  ONEBIT_ASSIGN_OR_RETURN(a->gathered_, Buffer<float>::Create(backend, w * chunk));
  return a;
}

absl::Status ExactAllreduce::Run(const float* in) {
  const int w = transport_->world_size();
  const size_t chunk_bytes = chunk_ * sizeof(float);
  // The padding of send_ stays zero: only the first n elements are ever written.
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(send_.data(), in, n_ * sizeof(float)));
  ONEBIT_RETURN_IF_ERROR(transport_->AllToAll(send_.data(), received_.data(), chunk_bytes));
  ONEBIT_RETURN_IF_ERROR(backend_->SumRows(received_.data(), w, chunk_, summed_.data()));
  return transport_->AllGather(summed_.data(), gathered_.data(), chunk_bytes);
}

}  // namespace onebit
