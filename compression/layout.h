// How a tensor of n float32 parameters is split into server chunks, for both sides of the
// exchange: every process computes the layout from the same numbers, so that no two ever
// disagree about a payload size.
//
// The layouts: peer at PeerPaddedSize, parameter server at PsLayout, hierarchical at
// HierarchicalLayout.
//
// Thread safety: immutable after Create.
#ifndef ONEBIT_COMPRESSION_LAYOUT_H_
#define ONEBIT_COMPRESSION_LAYOUT_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "compression/codec.h"
#include "compression/codec_registry.h"

namespace onebit {

// PEER (PeerPaddedSize): n_pad = n rounded up to a multiple of W*lcm(W, 8); chunk
// C = n_pad / W belongs to rank r as elements [r*C, (r+1)*C) (docs/algorithms.md).
//
// N_pad for n elements over w ranks in peer mode (a multiple of w*lcm(w, 8)).
size_t PeerPaddedSize(size_t n, int w);

// Values mirror onebit.v1.ChunkKind, so a proto enum converts with a cast; anything else is
// rejected by validation, never trusted.
enum class ChunkKind : int { kUnspecified = 0, kFp32 = 1, kOnebit = 2 };

const char* ChunkKindName(ChunkKind kind);  // "fp32", "onebit", or "unspecified"

// PARAMETER SERVER (PsLayout), the contract of onebit-server (ShardState) and the worker's
// PsExchange:
//
// COMPRESSION (CHUNK_KIND_ONEBIT, whatever the compressor): the peer layout of
// CompressedAllreduce with S in place of W. n_pad = n rounded up to a multiple of
// S*lcm(S, 8) (so also of S*8), chunk C = n_pad / S, shard s owns padded elements
// [s*C, (s+1)*C). A worker compresses its whole padded tensor (WorkerCompressor(n, S, C):
// 1 bit with one scale, or int8 with a scale and offset per chunk) into S blocks of
// codec.BlockBytes(C) bytes, 4 + C/8 or 8 + C (compression/codec.h); the codec is the
// job's exchange.compressor, the same on both ends (a block of another codec's size is
// rejected, naming the mismatch). Block s goes to shard s, which aggregates the W
// blocks of its chunk in worker-rank order (ChunkAggregator) and returns one block to
// every worker. With S == W this is exactly peer mode, so the results are bit-identical.
//
// WARMUP (CHUNK_KIND_FP32): no padding. The n values are split into S contiguous runs as
// evenly as possible: shard s gets n/S values, plus one for the first n%S shards, starting
// at offset s*(n/S) + min(s, n%S). A shard sums the W runs elementwise in worker-rank order
// starting from 0.0f (Backend::SumRows), as ExactAllreduce does, so the warmup sum has the
// same bits for every S (a sum of one element position never crosses shards). With S > n
// some shards get empty runs; they still take part (empty payloads).
class PsLayout {
 public:
  // n >= 1 parameters over 1 <= num_shards shards, compressed blocks in `codec`'s format
  // (whose alignment divides 8: the chunk is a multiple of 8).
  static absl::StatusOr<PsLayout> Create(size_t n, int num_shards,
                                         const Codec& codec = OnebitCodec());

  size_t n() const { return n_; }
  int num_shards() const { return num_shards_; }

  // Compression.
  size_t padded_size() const { return padded_size_; }
  size_t chunk() const { return padded_size_ / static_cast<size_t>(num_shards_); }
  const Codec& codec() const { return *codec_; }
  size_t block_bytes() const { return codec_->BlockBytes(chunk()); }

  // Warmup: shard s's run of the unpadded tensor.
  size_t fp32_offset(int shard) const;
  size_t fp32_count(int shard) const;
  size_t max_fp32_count() const { return fp32_count(0); }

  // Payload bytes of one push (and of its result) for `shard`: 4*fp32_count(shard) or
  // block_bytes(). 0 for kUnspecified.
  size_t payload_bytes(ChunkKind kind, int shard) const;
  // The largest payload of any push or result: 4*max_fp32_count() or block_bytes().
  size_t max_payload_bytes() const;
  // A bound on one serialized exchange message (push, result, pull) of this layout: the
  // largest payload plus room for the other fields. Both ends size gRPC's limits by it.
  size_t max_message_bytes() const { return max_payload_bytes() + kMessageOverheadBytes; }
  static constexpr size_t kMessageOverheadBytes = 64 << 10;

 private:
  PsLayout(size_t n, int num_shards, size_t padded_size, const Codec& codec)
      : n_(n), num_shards_(num_shards), padded_size_(padded_size), codec_(&codec) {}

  size_t n_;
  int num_shards_;
  size_t padded_size_;
  const Codec* codec_;
};

// HIERARCHICAL (HierarchicalLayout): nodes x local_size workers. The tensor is padded to
// n_pad = local_size * S and cut into local_size slices of S elements; slice l is
// averaged at full precision inside each node, and exchanged between the nodes by local
// rank l of every node, as a tensor of S elements in `inter_chunks` server chunks (one per
// node in peer mode, the slice's shards in ps mode). S is the smallest multiple of
// inter_chunks*lcm(inter_chunks, 8) that is >= ceil(n / local_size), so the inter-node
// exchange of a slice needs no padding of its own and the local_size * inter_chunks result
// blocks, in slice order, are the whole padded tensor.
class HierarchicalLayout {
 public:
  // n >= 1 parameters, local_size >= 1 workers per node, inter_chunks >= 1 server chunks
  // per slice.
  static absl::StatusOr<HierarchicalLayout> Create(size_t n, int local_size, int inter_chunks);

  size_t n() const { return n_; }
  int local_size() const { return local_size_; }
  int inter_chunks() const { return inter_chunks_; }
  size_t slice() const { return slice_; }
  size_t padded_size() const { return slice_ * static_cast<size_t>(local_size_); }
  size_t chunk() const { return slice_ / static_cast<size_t>(inter_chunks_); }
  size_t num_chunks() const { return static_cast<size_t>(local_size_) * inter_chunks_; }
  // Elements of slice `local_rank` that hold parameters (the rest is padding).
  size_t slice_count(int local_rank) const;

 private:
  HierarchicalLayout(size_t n, int local_size, int inter_chunks, size_t slice)
      : n_(n), local_size_(local_size), inter_chunks_(inter_chunks), slice_(slice) {}

  size_t n_;
  int local_size_;
  int inter_chunks_;
  size_t slice_;
};

}  // namespace onebit

#endif  // ONEBIT_COMPRESSION_LAYOUT_H_
