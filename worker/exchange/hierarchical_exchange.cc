#include "worker/exchange/hierarchical_exchange.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/worker_compressor.h"
#include "worker/exchange/peer_exchange.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<HierarchicalExchange>> HierarchicalExchange::Create(
    kernels::Backend* backend, Transport* intra, std::unique_ptr<Exchange> inter,
    const HierarchicalLayout& layout) {
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *intra));
  if (intra->world_size() != layout.local_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the node's transport has ",
                                                   intra->world_size(), " ranks, the layout ",
                                                   layout.local_size(), " workers per node"));
  }
  if (inter != nullptr && inter->world_size() < 1) {
    return absl::InvalidArgumentError("the inter-node exchange has no ranks");
  }
  std::unique_ptr<HierarchicalExchange> e(
      new HierarchicalExchange(backend, intra, std::move(inter), layout));
  ONEBIT_RETURN_IF_ERROR(e->Init());
  return e;
}

absl::StatusOr<std::unique_ptr<HierarchicalExchange>> HierarchicalExchange::CreatePeer(
    kernels::Backend* backend, Transport* intra, Transport* inter, size_t n,
    const Codec& codec) {
  ONEBIT_ASSIGN_OR_RETURN(HierarchicalLayout layout,
                          HierarchicalLayout::Create(n, intra->world_size(), inter->world_size()));
  std::unique_ptr<Exchange> between_nodes;
  if (inter->world_size() > 1) {
    ONEBIT_ASSIGN_OR_RETURN(between_nodes,
                            PeerExchange::Create(backend, inter, layout.slice(),
                                                 ExactAllreduceOptions(), codec));
  }
  return Create(backend, intra, std::move(between_nodes), layout);
}

HierarchicalExchange::HierarchicalExchange(kernels::Backend* backend, Transport* intra,
                                           std::unique_ptr<Exchange> inter,
                                           const HierarchicalLayout& layout)
    : backend_(backend),
      intra_(intra),
      inter_(std::move(inter)),
      layout_(layout),
      nodes_(inter_ == nullptr ? 1 : inter_->world_size()) {}

absl::Status HierarchicalExchange::Init() {
  using kernels::Buffer;
  const size_t local = static_cast<size_t>(layout_.local_size());
  const size_t slice = layout_.slice();
  ONEBIT_ASSIGN_OR_RETURN(padded_, Buffer<float>::Create(backend_, layout_.padded_size()));
  ONEBIT_ASSIGN_OR_RETURN(received_, Buffer<float>::Create(backend_, local * slice));
  ONEBIT_ASSIGN_OR_RETURN(slice_sum_, Buffer<float>::Create(backend_, slice));
  ONEBIT_ASSIGN_OR_RETURN(gathered_, Buffer<float>::Create(backend_, layout_.padded_size()));
  ONEBIT_ASSIGN_OR_RETURN(slice_m_, Buffer<float>::Create(backend_, slice));
  if (inter_ == nullptr) {
    ONEBIT_ASSIGN_OR_RETURN(idle_compressor_, WorkerCompressor::Create(backend_, 0, 1, 8));
    return absl::OkStatus();
  }
  codec_ = &inter_->worker_compressor().codec();
  ONEBIT_ASSIGN_OR_RETURN(blocks_, Buffer<uint8_t>::Create(backend_, layout_.num_chunks() *
                                                                 codec_->BlockBytes(layout_.chunk())));
  return absl::OkStatus();
}

absl::Status HierarchicalExchange::ReduceScatter(const float* in, bool average) {
  const int local = layout_.local_size();
  const size_t slice = layout_.slice();
  // The padding of padded_ stays zero: only the first n elements are ever written.
  ONEBIT_RETURN_IF_ERROR(backend_->Copy(padded_.data(), in, layout_.n() * sizeof(float)));
  ONEBIT_RETURN_IF_ERROR(
      intra_->AllToAll(padded_.data(), received_.data(), slice * sizeof(float)));
  return average ? backend_->AverageRows(received_.data(), local, slice, slice_sum_.data())
                 : backend_->SumRows(received_.data(), local, slice, slice_sum_.data());
}

absl::StatusOr<const float*> HierarchicalExchange::SumGradients(int64_t step, const float* grad) {
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(grad, /*average=*/false));
  const float* slice_total = slice_sum_.data();
  if (inter_ != nullptr) {
    ONEBIT_ASSIGN_OR_RETURN(slice_total, inter_->SumGradients(step, slice_sum_.data()));
  }
  ONEBIT_RETURN_IF_ERROR(
      intra_->AllGather(slice_total, gathered_.data(), layout_.slice() * sizeof(float)));
  return gathered_.data();
}

absl::StatusOr<CompressedResult> HierarchicalExchange::AverageMomentum(int64_t step,
                                                                       const float* m,
                                                                       const float* g,
                                                                       float beta1) {
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(g, /*average=*/true));
  const size_t slice = layout_.slice();
  // This slice of m; past the parameters it stays zero, as the padding of a flat exchange.
  if (const size_t count = layout_.slice_count(local_rank()); count > 0) {
    ONEBIT_RETURN_IF_ERROR(
        backend_->Copy(slice_m_.data(), m + local_rank() * slice, count * sizeof(float)));
  }
  if (inter_ == nullptr) {  // one node: the exact average, nothing compressed
    ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(beta1, slice_sum_.data(), slice_m_.data(), slice));
    ONEBIT_RETURN_IF_ERROR(
        intra_->AllGather(slice_m_.data(), gathered_.data(), slice * sizeof(float)));
    CompressedResult exact;
    exact.exact = gathered_.data();
    return exact;
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r,
                          inter_->AverageMomentum(step, slice_m_.data(), slice_sum_.data(), beta1));
  return GatherSlices(r);
}

absl::StatusOr<CompressedResult> HierarchicalExchange::GatherSlices(const CompressedResult& r) {
  if (r.blocks == nullptr || r.chunk != layout_.chunk() ||
      r.num_chunks != static_cast<size_t>(layout_.inter_chunks()) || r.codec != codec_) {
    return absl::InternalError(absl::StrCat(
        "the inter-node exchange returned ", r.num_chunks, " ",
        r.codec == nullptr ? "unencoded" : r.codec->name(), " chunks of ", r.chunk,
        ", the layout wants ", layout_.inter_chunks(), " ", codec_->name(), " of ",
        layout_.chunk()));
  }
  const size_t slice_bytes = r.num_chunks * codec_->BlockBytes(r.chunk);
  ONEBIT_RETURN_IF_ERROR(intra_->AllGather(r.blocks, blocks_.data(), slice_bytes));
  return CompressedResult{codec_, blocks_.data(), layout_.num_chunks(), layout_.chunk()};
}

absl::StatusOr<CompressedResult> HierarchicalExchange::CompressedAverage(int64_t step,
                                                                         const float* x) {
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(x, /*average=*/true));
  const size_t slice = layout_.slice();
  if (inter_ == nullptr) {  // one node: the exact average, nothing compressed
    ONEBIT_RETURN_IF_ERROR(
        intra_->AllGather(slice_sum_.data(), gathered_.data(), slice * sizeof(float)));
    CompressedResult exact;
    exact.exact = gathered_.data();
    return exact;
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r, inter_->CompressedAverage(step, slice_sum_.data()));
  return GatherSlices(r);
}

absl::StatusOr<bool> HierarchicalExchange::AnyOverflow(int64_t step, bool local_overflow) {
  // Inside the node first; then every local rank asks its own inter-node exchange (the same
  // local rank on the other nodes), so no broadcast is needed.
  ONEBIT_ASSIGN_OR_RETURN(const bool node, AnyAcrossRanks(intra_, backend_, &flag_,
                                                           local_overflow));
  return inter_ != nullptr ? inter_->AnyOverflow(step, node) : node;
}

absl::Status HierarchicalExchange::ResetErrors(int64_t step) {
  return inter_ != nullptr ? inter_->ResetErrors(step) : absl::OkStatus();
}

WorkerCompressor& HierarchicalExchange::worker_compressor() {
  return inter_ != nullptr ? inter_->worker_compressor() : *idle_compressor_;
}

LinkBytes HierarchicalExchange::intra_node_bytes() const {
  return {intra_->bytes_sent(), intra_->bytes_received()};
}

LinkBytes HierarchicalExchange::inter_node_bytes() const {
  return inter_ != nullptr ? LinkBytes{inter_->bytes_sent(), inter_->bytes_received()}
                           : LinkBytes{};
}

uint64_t HierarchicalExchange::bytes_sent() const {
  return intra_node_bytes().sent + inter_node_bytes().sent;
}

uint64_t HierarchicalExchange::bytes_received() const {
  return intra_node_bytes().received + inter_node_bytes().received;
}

absl::StatusOr<ErrorState> HierarchicalExchange::SaveErrors() {
  if (inter_ == nullptr) return ErrorState();
  return inter_->SaveErrors();
}

absl::Status HierarchicalExchange::RestoreErrors(const ErrorState& state) {
  if (inter_ == nullptr) return absl::OkStatus();
  return inter_->RestoreErrors(state);
}

}  // namespace onebit
