// onebit.v1.PushChunk and ChunkResult (proto/onebit/v1/exchange.proto) as gRPC ByteBuffers,
// without copying the payload through a protobuf std::string: ps mode's hot path.
//
// ENCODING: a message is a few slices: the other fields and the payload's tag and length
// (a few dozen bytes), then the payload slice as the caller gave it (a copy of the
// worker's floats, or the shard's result string referenced, not copied), then for
// PushChunk a checkpoint flag after it. The bytes are exactly what protobuf's
// SerializeAsString writes for the same message (fields in number order, proto3 defaults
// left out), so any protobuf client or server reads them.
//
// DECODING: the ByteBuffer's slices become an absl::Cord by reference (no copy); the
// fields are read off it, and the payload is a sub-Cord of the same slices. Unknown fields
// are skipped as protobuf skips them; a known field with another wire type is an unknown
// field (protobuf's rule); the last occurrence of a field wins. A truncated varint, a
// length past the end, field number 0, a group (wire types 3/4, not in proto3) or wire
// type 6/7 is INVALID_ARGUMENT naming the byte offset: bytes from the network never crash.
//
// Thread safety: free functions over values; a Cord is as thread-safe as a std::string.
#ifndef ONEBIT_PROTO_EXCHANGE_WIRE_H_
#define ONEBIT_PROTO_EXCHANGE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace onebit::wire {

// The full method name of ParameterServer.Exchange, for grpc::GenericStub.
inline constexpr char kExchangeMethod[] = "/onebit.v1.ParameterServer/Exchange";

struct PushFields {
  int32_t worker = 0;
  int64_t step = 0;
  int32_t chunk = 0;
  int32_t kind = 0;  // onebit.v1.ChunkKind, unchecked (an open enum)
  bool checkpoint = false;
  bool reset_errors = false;
  absl::Cord payload;
};

struct ResultFields {
  int64_t step = 0;
  int32_t chunk = 0;
  int32_t kind = 0;
  absl::Cord payload;
};

// `payload` is sent as it is (its reference is taken, its bytes are not copied).
grpc::ByteBuffer EncodePush(int32_t worker, int64_t step, int32_t chunk, int32_t kind,
                            bool checkpoint, const grpc::Slice& payload,
                            bool reset_errors = false);
grpc::ByteBuffer EncodeResult(int64_t step, int32_t chunk, int32_t kind,
                              const grpc::Slice& payload);

// A slice over `bytes` that keeps the string alive (a reference, no copy).
grpc::Slice SharedSlice(std::shared_ptr<const std::string> bytes);
// A slice over [data, data + size) that keeps `owner` alive until gRPC lets go of it
// (owner.use_count() tells whether it still holds it).
grpc::Slice OwnedSlice(std::shared_ptr<const void> owner, const void* data, size_t size);

// The buffer's bytes by reference.
absl::Cord ToCord(const grpc::ByteBuffer& buffer);
// The whole message in one string (tests, fuzzing).
std::string Flatten(const grpc::ByteBuffer& buffer);

absl::StatusOr<PushFields> ParsePush(const absl::Cord& message);
absl::StatusOr<ResultFields> ParseResult(const absl::Cord& message);

// Copies the cord's bytes to dst (cord.size() bytes): one copy, chunk by chunk.
void CopyTo(const absl::Cord& cord, void* dst);

}  // namespace onebit::wire

#endif  // ONEBIT_PROTO_EXCHANGE_WIRE_H_
