#include "worker/exchange/hierarchical_exchange.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/worker_compressor.h"
#include "worker/exchange/peer_exchange.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<HierarchicalExchange>> HierarchicalExchange::Create(
    kernels::Backend* backend, Transport* intra, std::unique_ptr<Exchange> inter,
    const HierarchicalLayout& layout, const HierarchicalOptions& options) {
  ONEBIT_RETURN_IF_ERROR(CheckSameMemorySpace(*backend, *intra));
  if (intra->world_size() != layout.local_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the node's transport has ",
                                                   intra->world_size(), " ranks, the layout ",
                                                   layout.local_size(), " workers per node"));
  }
  if (inter != nullptr && inter->world_size() < 1) {
    return absl::InvalidArgumentError("the inter-node exchange has no ranks");
  }
  const int nodes = inter == nullptr ? 1 : inter->world_size();
  if (options.segment_elements < 1) {
    return absl::InvalidArgumentError("segment_elements must be >= 1");
  }
  if (options.node < 0 || options.node >= nodes) {
    return absl::InvalidArgumentError(absl::StrCat("node ", options.node, " of ", nodes,
                                                   " nodes (the inter-node exchange's ranks)"));
  }
  std::unique_ptr<HierarchicalExchange> e(
      new HierarchicalExchange(backend, intra, std::move(inter), layout, options));
  ONEBIT_RETURN_IF_ERROR(e->Init());
  return e;
}

absl::StatusOr<std::unique_ptr<HierarchicalExchange>> HierarchicalExchange::CreatePeer(
    kernels::Backend* backend, Transport* intra, Transport* inter, size_t n,
    const Codec& codec, const HierarchicalOptions& options) {
  ONEBIT_ASSIGN_OR_RETURN(HierarchicalLayout layout,
                          HierarchicalLayout::Create(n, intra->world_size(), inter->world_size()));
  std::unique_ptr<Exchange> between_nodes;
  if (inter->world_size() > 1) {
    ONEBIT_ASSIGN_OR_RETURN(between_nodes,
                            PeerExchange::Create(backend, inter, layout.slice(),
                                                 ExactAllreduceOptions(), codec));
  }
  HierarchicalOptions with_node = options;
  with_node.node = inter->rank();
  return Create(backend, intra, std::move(between_nodes), layout, with_node);
}

HierarchicalExchange::HierarchicalExchange(kernels::Backend* backend, Transport* intra,
                                           std::unique_ptr<Exchange> inter,
                                           const HierarchicalLayout& layout,
                                           const HierarchicalOptions& options)
    : backend_(backend),
      intra_(intra),
      inter_(std::move(inter)),
      layout_(layout),
      options_(options),
      nodes_(inter_ == nullptr ? 1 : inter_->world_size()) {}

absl::Status HierarchicalExchange::Init() {
  using kernels::Buffer;
  const size_t local = static_cast<size_t>(layout_.local_size());
  const size_t slice = layout_.slice();
  ONEBIT_ASSIGN_OR_RETURN(send_, Buffer<float>::Create(backend_, local * segment()));
  ONEBIT_ASSIGN_OR_RETURN(received_, Buffer<float>::Create(backend_, local * segment()));
  ONEBIT_ASSIGN_OR_RETURN(slice_sum_, Buffer<float>::Create(backend_, slice));
  if (inter_ == nullptr) {
    ONEBIT_ASSIGN_OR_RETURN(idle_compressor_, WorkerCompressor::Create(backend_, 0, 1, 8));
  } else {
    codec_ = &inter_->worker_compressor().codec();
  }
  if (sharded()) {
    // Slice l's results stay in slice_sum_, stage_ or the inter exchange's result: no whole
    // sum, no copy of m, no gathered blocks.
    ONEBIT_ASSIGN_OR_RETURN(stage_, Buffer<float>::Create(backend_, slice));
    return absl::OkStatus();
  }
  ONEBIT_ASSIGN_OR_RETURN(gathered_, Buffer<float>::Create(backend_, layout_.padded_size()));
  ONEBIT_ASSIGN_OR_RETURN(slice_m_, Buffer<float>::Create(backend_, slice));
  if (inter_ != nullptr) {
    ONEBIT_ASSIGN_OR_RETURN(blocks_, Buffer<uint8_t>::Create(
                                         backend_, layout_.num_chunks() *
                                                       codec_->BlockBytes(layout_.chunk())));
  }
  return absl::OkStatus();
}

absl::Status HierarchicalExchange::CheckMode(bool sharded_call, absl::string_view call,
                                             absl::string_view instead) const {
  if (sharded_call == sharded()) return absl::OkStatus();
  if (sharded()) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": this hierarchical exchange shards the optimizer state (shard_state), so it "
              "keeps no whole-tensor result; call ", instead));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      call, ": this hierarchical exchange was built without shard_state, so every worker "
            "keeps the whole optimizer state; call ", instead));
}

size_t HierarchicalExchange::segment() const {
  return std::min(options_.segment_elements, layout_.slice());
}

absl::Status HierarchicalExchange::ExchangeSegment(Gradient in, size_t begin, size_t count,
                                                   float scale, float* rows) {
  const size_t n = layout_.n(), slice = layout_.slice();
  for (int j = 0; j < layout_.local_size(); ++j) {
    // Local rank j's segment: in[j*S + begin, + count), zero past n (the padding).
    const size_t from = static_cast<size_t>(j) * slice + begin;
    const size_t have = from >= n ? 0 : std::min(count, n - from);
    float* block = send_.data() + static_cast<size_t>(j) * count;
    if (have > 0) {
      if (in.is_fp32()) {
        ONEBIT_RETURN_IF_ERROR(backend_->Copy(block, in.fp32() + from, have * sizeof(float)));
      } else {  // exact: the float32 values a float32 gradient buffer would hold
        ONEBIT_RETURN_IF_ERROR(backend_->WireToFloat(in.dtype, in.From(from).data, have, block));
      }
      // The bits of GradientClipper::Clip's copy: the same float multiply per element.
      if (scale != 1.0f) ONEBIT_RETURN_IF_ERROR(backend_->Scale(scale, block, have));
    }
    if (have < count) {
      ONEBIT_RETURN_IF_ERROR(backend_->Zero(block + have, (count - have) * sizeof(float)));
    }
  }
  return intra_->AllToAll(send_.data(), rows, count * sizeof(float));
}

absl::Status HierarchicalExchange::ReduceScatter(Gradient in, bool average, float scale) {
  rows_step_.reset();  // ShardRows' rows are valid until the next call (exchange.h)
  const int local = layout_.local_size();
  const size_t slice = layout_.slice(), segment = this->segment();
  for (size_t begin = 0; begin < slice; begin += segment) {
    const size_t count = std::min(segment, slice - begin);
    ONEBIT_RETURN_IF_ERROR(ExchangeSegment(in, begin, count, scale, received_.data()));
    // Elementwise in local-rank order from 0.0f: the bits of one whole-slice SumRows.
    float* out = slice_sum_.data() + begin;
    ONEBIT_RETURN_IF_ERROR(average ? backend_->AverageRows(received_.data(), local, count, out)
                                   : backend_->SumRows(received_.data(), local, count, out));
  }
  return absl::OkStatus();
}

absl::StatusOr<const float*> HierarchicalExchange::SumGradients(int64_t step, const float* grad) {
  ONEBIT_RETURN_IF_ERROR(CheckMode(false, "SumGradients", "SumGradientsOfShard"));
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
  ONEBIT_RETURN_IF_ERROR(CheckMode(false, "AverageMomentum", "AverageMomentumOfShard"));
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(g, /*average=*/true));
  const size_t slice = layout_.slice();
  // This slice of m; past the parameters it stays zero, as the padding of a flat exchange.
  if (const size_t count = layout_.slice_count(local_rank()); count > 0) {
    ONEBIT_RETURN_IF_ERROR(
        backend_->Copy(slice_m_.data(), m + local_rank() * slice, count * sizeof(float)));
  }
  if (inter_ == nullptr) {  // one node: the exact average, nothing compressed
    ONEBIT_RETURN_IF_ERROR(backend_->MomentumUpdate(beta1, slice_sum_.data(), slice_m_.data(), slice));
    return GatherExact(slice_m_.data());
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r,
                          inter_->AverageMomentum(step, slice_m_.data(), slice_sum_.data(), beta1));
  return GatherSlices(r);
}

absl::Status HierarchicalExchange::CheckInterResult(const CompressedResult& r) const {
  if (r.blocks == nullptr || r.chunk != layout_.chunk() ||
      r.num_chunks != static_cast<size_t>(layout_.inter_chunks()) || r.codec != codec_) {
    return absl::InternalError(absl::StrCat(
        "the inter-node exchange returned ", r.num_chunks, " ",
        r.codec == nullptr ? "unencoded" : r.codec->name(), " chunks of ", r.chunk,
        ", the layout wants ", layout_.inter_chunks(), " ", codec_->name(), " of ",
        layout_.chunk()));
  }
  return absl::OkStatus();
}

absl::StatusOr<CompressedResult> HierarchicalExchange::GatherExact(const float* slice) {
  ONEBIT_RETURN_IF_ERROR(
      intra_->AllGather(slice, gathered_.data(), layout_.slice() * sizeof(float)));
  return CompressedResult::Exact(gathered_.data());
}

absl::StatusOr<CompressedResult> HierarchicalExchange::GatherSlices(const CompressedResult& r) {
  ONEBIT_RETURN_IF_ERROR(CheckInterResult(r));
  const size_t slice_bytes = r.num_chunks * codec_->BlockBytes(r.chunk);
  ONEBIT_RETURN_IF_ERROR(intra_->AllGather(r.blocks, blocks_.data(), slice_bytes));
  return CompressedResult{codec_, blocks_.data(), layout_.num_chunks(), layout_.chunk()};
}

absl::StatusOr<CompressedResult> HierarchicalExchange::CompressedAverage(int64_t step,
                                                                         const float* x) {
  ONEBIT_RETURN_IF_ERROR(
      CheckMode(false, "CompressedAverage", "ShardRows, then CompressedAverageOfRows"));
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(x, /*average=*/true));
  if (inter_ == nullptr) {  // one node: the exact average, nothing compressed
    return GatherExact(slice_sum_.data());
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r, inter_->CompressedAverage(step, slice_sum_.data()));
  return GatherSlices(r);
}

std::optional<StateShard> HierarchicalExchange::state_shard() const {
  if (!sharded()) return std::nullopt;
  StateShard shard;
  const int l = local_rank();
  const size_t count = layout_.slice_count(l);
  shard.begin = count > 0 ? static_cast<size_t>(l) * layout_.slice() : layout_.n();
  shard.end = shard.begin + count;
  shard.stride = layout_.slice();
  shard.piece = l;
  shard.pieces = layout_.local_size();
  shard.replica = options_.node;
  shard.replicas = nodes_;
  return shard;
}

absl::StatusOr<const float*> HierarchicalExchange::SumGradientsOfShard(int64_t step,
                                                                       Gradient grad) {
  ONEBIT_RETURN_IF_ERROR(CheckMode(true, "SumGradientsOfShard", "SumGradients"));
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(grad, /*average=*/false));
  if (inter_ == nullptr) return slice_sum_.data();
  return inter_->SumGradients(step, slice_sum_.data());
}

absl::StatusOr<CompressedResult> HierarchicalExchange::AverageMomentumOfShard(
    int64_t step, const float* m_shard, Gradient g, float beta1, float g_scale) {
  ONEBIT_RETURN_IF_ERROR(CheckMode(true, "AverageMomentumOfShard", "AverageMomentum"));
  ONEBIT_RETURN_IF_ERROR(ReduceScatter(g, /*average=*/true, g_scale));
  const size_t slice = layout_.slice();
  if (inter_ == nullptr) {  // one node: the exact average, nothing compressed
    ONEBIT_RETURN_IF_ERROR(backend_->Copy(stage_.data(), m_shard, slice * sizeof(float)));
    ONEBIT_RETURN_IF_ERROR(
        backend_->MomentumUpdate(beta1, slice_sum_.data(), stage_.data(), slice));
    return CompressedResult::Exact(stage_.data());
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r,
                          inter_->AverageMomentum(step, m_shard, slice_sum_.data(), beta1));
  ONEBIT_RETURN_IF_ERROR(CheckInterResult(r));
  return r;
}

absl::StatusOr<float*> HierarchicalExchange::ShardRows(int64_t step, Gradient x, float scale) {
  ONEBIT_RETURN_IF_ERROR(CheckMode(true, "ShardRows", "CompressedAverage"));
  rows_step_.reset();
  const size_t local = static_cast<size_t>(layout_.local_size());
  const size_t slice = layout_.slice(), segment = this->segment();
  if (rows_.size() != local * slice) {
    ONEBIT_ASSIGN_OR_RETURN(rows_, kernels::Buffer<float>::Create(backend_, local * slice));
  }
  for (size_t begin = 0; begin < slice; begin += segment) {
    const size_t count = std::min(segment, slice - begin);
    if (count == slice) {  // one segment: its rows are the whole rows
      ONEBIT_RETURN_IF_ERROR(ExchangeSegment(x, 0, slice, scale, rows_.data()));
      break;
    }
    ONEBIT_RETURN_IF_ERROR(ExchangeSegment(x, begin, count, scale, received_.data()));
    for (size_t j = 0; j < local; ++j) {
      ONEBIT_RETURN_IF_ERROR(backend_->Copy(rows_.data() + j * slice + begin,
                                            received_.data() + j * count,
                                            count * sizeof(float)));
    }
  }
  rows_step_ = step;
  return rows_.data();
}

absl::StatusOr<CompressedResult> HierarchicalExchange::CompressedAverageOfRows(int64_t step) {
  ONEBIT_RETURN_IF_ERROR(CheckMode(true, "CompressedAverageOfRows", "CompressedAverage"));
  if (rows_step_ != step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CompressedAverageOfRows(", step, "): ShardRows(", step,
        ") must come just before it (the rows in hand: ",
        rows_step_.has_value() ? absl::StrCat("step ", *rows_step_) : std::string("none"), ")"));
  }
  rows_step_.reset();
  const size_t slice = layout_.slice();
  ONEBIT_RETURN_IF_ERROR(
      backend_->AverageRows(rows_.data(), layout_.local_size(), slice, slice_sum_.data()));
  if (inter_ == nullptr) {  // one node: the exact average, nothing compressed
    return CompressedResult::Exact(slice_sum_.data());
  }
  ONEBIT_ASSIGN_OR_RETURN(CompressedResult r,
                          inter_->CompressedAverage(step, slice_sum_.data()));
  ONEBIT_RETURN_IF_ERROR(CheckInterResult(r));
  return r;
}

absl::Status HierarchicalExchange::AllGatherShards(float* whole) {
  return AllGatherShardBytes(whole, sizeof(float));
}

absl::Status HierarchicalExchange::AllGatherShardBytes(void* whole, size_t element_bytes) {
  ONEBIT_RETURN_IF_ERROR(
      CheckMode(true, "AllGatherShardBytes", "nothing: the parameters are whole already"));
  if (element_bytes == 0 || element_bytes > sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherShardBytes: elements of ", element_bytes, " bytes (1 to 4)"));
  }
  // stage_ holds a slice of floats: room for a slice of narrower elements.
  const size_t bytes = layout_.slice() * element_bytes;
  char* const at = static_cast<char*>(whole);
  ONEBIT_RETURN_IF_ERROR(
      backend_->Copy(stage_.data(), at + static_cast<size_t>(local_rank()) * bytes, bytes));
  return intra_->AllGather(stage_.data(), whole, bytes);
}

absl::StatusOr<std::vector<double>> HierarchicalExchange::GatherPartials(
    const std::vector<double>& mine) {
  ONEBIT_RETURN_IF_ERROR(
      CheckMode(true, "GatherPartials", "nothing: every worker has every partial"));
  const size_t k = mine.size();
  if (k == 0) return std::vector<double>();  // the same length everywhere: no one sends
  const size_t local = static_cast<size_t>(layout_.local_size());
  // [0, k): this rank's; then every rank's, in rank order (send and receive apart).
  if (partials_.size() != (1 + local) * k) {
    ONEBIT_ASSIGN_OR_RETURN(partials_,
                            kernels::Buffer<double>::Create(backend_, (1 + local) * k));
  }
  ONEBIT_RETURN_IF_ERROR(
      backend_->CopyFromHost(partials_.data(), mine.data(), k * sizeof(double)));
  ONEBIT_RETURN_IF_ERROR(
      intra_->AllGather(partials_.data(), partials_.data() + k, k * sizeof(double)));
  return partials_.SliceToHost(k, (1 + local) * k);
}

uint64_t HierarchicalExchange::buffer_bytes() const {
  uint64_t bytes = send_.bytes() + received_.bytes() + slice_sum_.bytes() + slice_m_.bytes() +
                   gathered_.bytes() + blocks_.bytes() + stage_.bytes() + rows_.bytes() +
                   partials_.bytes() + flag_.bytes();
  if (inter_ != nullptr) bytes += inter_->buffer_bytes();
  return bytes;
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
