// One checkpoint part: the state one process writes (a worker's slice of p, m and v plus
// its own error buffers, or a shard's server error), as a self-checking file.
//
// FORMAT (version 1, little-endian, every length checked against the bytes left):
//   "ONEBITPT"                                   8 bytes magic
//   u32 version                                  1
//   u64 body_bytes                               length of the body that follows
//   body:
//     u32 num_meta,    then per entry: u32 key_len, key, u32 value_len, value
//     u32 num_tensors, then per tensor: u32 name_len, name, u8 dtype (1 = float32),
//                                       u32 ndim, u64 dim[ndim], raw elements
//   u32 crc32 (zlib) of everything before it
// Names are the optimizer state names ("params", "exp_avg", "exp_avg_sq", "worker_error",
// "server_error"); meta holds the step, role, rank, topology and the slice a tensor covers.
//
// DecodePart accepts any bytes: a truncated, corrupt or hostile file is DATA_LOSS (or
// INVALID_ARGUMENT for a foreign file) naming what is wrong, never a crash and never an
// allocation larger than the input.
//
// Thread safety: free functions, thread safe.
#ifndef ONEBIT_CHECKPOINT_PART_H_
#define ONEBIT_CHECKPOINT_PART_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace onebit::checkpoint {

inline constexpr char kPartMagic[] = "ONEBITPT";
inline constexpr uint32_t kPartVersion = 1;
// Limits a decoder enforces besides the input's own length.
inline constexpr uint32_t kMaxPartEntries = 1024;
inline constexpr uint32_t kMaxPartNameBytes = 4096;
inline constexpr uint32_t kMaxPartDims = 8;

struct Tensor {
  std::vector<uint64_t> shape;  // product == data.size()
  std::vector<float> data;
};

struct Part {
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> tensors;

  // Convenience: a 1-D tensor.
  void Put(const std::string& name, std::vector<float> data);
  // The named tensor, or NOT_FOUND / DATA_LOSS naming it.
  absl::StatusOr<const Tensor*> Get(const std::string& name) const;
  // meta[key] as an integer; NOT_FOUND or DATA_LOSS naming it.
  absl::StatusOr<int64_t> MetaInt(const std::string& key) const;
  void PutMetaInt(const std::string& key, int64_t value);
};

std::string EncodePart(const Part& part);
absl::StatusOr<Part> DecodePart(absl::string_view bytes);

// zlib's CRC-32 of `bytes`, the checksum manifests record for whole part files.
uint32_t Crc32(absl::string_view bytes);

// Writes `part` to `path` atomically (common/atomic_file.h); returns the file's size and
// CRC-32 so the caller can report them for the manifest.
struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
absl::StatusOr<WrittenFile> WritePart(const std::string& path, const Part& part);
// Reads and decodes; errors name the path.
absl::StatusOr<Part> ReadPart(const std::string& path);
// A part's meta and its tensors' names and shapes (each Tensor's `data` empty), read from
// the front of the file with the elements skipped, so without the checksum, which covers
// them: enough to decide whether a part is needed, then ReadPart checks all of it. Errors
// as ReadPart's for the parts it reads.
absl::StatusOr<Part> ReadPartHead(const std::string& path);
// The whole file's size and CRC-32, for verifying against a manifest.
absl::StatusOr<WrittenFile> ChecksumFile(const std::string& path);

}  // namespace onebit::checkpoint

#endif  // ONEBIT_CHECKPOINT_PART_H_
