#include "compression/layout.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace onebit {

// More shards than this is a configuration mistake, not a deployment.
constexpr int kMaxShards = 65536;

size_t PeerPaddedSize(size_t n, int w) {
  const size_t ws = static_cast<size_t>(w);
  const size_t multiple = ws * std::lcm(ws, size_t{8});
  return (n + multiple - 1) / multiple * multiple;
}

const char* ChunkKindName(ChunkKind kind) {
  switch (kind) {
    case ChunkKind::kFp32:
      return "fp32";
    case ChunkKind::kOnebit:
      return "onebit";
    default:
      return "unspecified";
  }
}

absl::StatusOr<PsLayout> PsLayout::Create(size_t n, int num_shards, const Codec& codec) {
  if (n == 0) return absl::InvalidArgumentError("the tensor must have at least one element");
  if (num_shards < 1 || num_shards > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard count must be in [1, ", kMaxShards, "], got ", num_shards));
  }
  if (8 % codec.alignment() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", codec.name(), " codec's chunks must be multiples of ", codec.alignment(),
        ", which the parameter-server layout (multiples of 8) does not give"));
  }
  // The peer layout with S for W.
  const PsLayout layout(n, num_shards, PeerPaddedSize(n, num_shards), codec);
  // gRPC's limits are ints and protobuf refuses messages over 2 GiB: a warmup push carries
  // a shard's whole fp32 run in one message.
  constexpr size_t kMaxMessage = static_cast<size_t>(std::numeric_limits<int32_t>::max());
  if (layout.max_message_bytes() > kMaxMessage) {
    const size_t per_shard = (kMaxMessage - kMessageOverheadBytes) / sizeof(float);
    return absl::InvalidArgumentError(absl::StrCat(
        n, " parameters over ", num_shards, " shard(s) make a push of ",
        layout.max_payload_bytes(), " bytes, over the 2 GiB that gRPC and protobuf allow in "
        "one message: use at least ", (n + per_shard - 1) / per_shard, " shards"));
  }
  return layout;
}

size_t PsLayout::max_payload_bytes() const {
  return std::max(max_fp32_count() * sizeof(float), block_bytes());
}

size_t PsLayout::fp32_offset(int shard) const {
  const size_t s = static_cast<size_t>(shard);
  const size_t base = n_ / static_cast<size_t>(num_shards_);
  const size_t extra = n_ % static_cast<size_t>(num_shards_);
  return s * base + std::min(s, extra);
}

size_t PsLayout::fp32_count(int shard) const {
  const size_t base = n_ / static_cast<size_t>(num_shards_);
  const size_t extra = n_ % static_cast<size_t>(num_shards_);
  return base + (static_cast<size_t>(shard) < extra ? 1 : 0);
}

size_t PsLayout::payload_bytes(ChunkKind kind, int shard) const {
  switch (kind) {
    case ChunkKind::kFp32:
      return fp32_count(shard) * sizeof(float);
    case ChunkKind::kOnebit:
      return block_bytes();
    default:
      return 0;
  }
}

absl::StatusOr<HierarchicalLayout> HierarchicalLayout::Create(size_t n, int local_size,
                                                              int inter_chunks) {
  if (n == 0) return absl::InvalidArgumentError("the tensor must have at least one element");
  if (local_size < 1 || local_size > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("local size must be in [1, ", kMaxShards, "], got ", local_size));
  }
  if (inter_chunks < 1 || inter_chunks > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("inter-node chunk count must be in [1, ", kMaxShards, "], got ", inter_chunks));
  }
  const size_t l = static_cast<size_t>(local_size);
  const size_t slice = PeerPaddedSize((n + l - 1) / l, inter_chunks);
  return HierarchicalLayout(n, local_size, inter_chunks, slice);
}

size_t HierarchicalLayout::slice_count(int local_rank) const {
  const size_t begin = static_cast<size_t>(local_rank) * slice_;
  return begin >= n_ ? 0 : std::min(slice_, n_ - begin);
}

}  // namespace onebit
