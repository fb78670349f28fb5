#include "proto/exchange_wire.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace onebit::wire {
namespace {

enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

constexpr size_t kMaxVarint = 10;

// Slices up to this size are copied into the Cord rather than referenced.
constexpr size_t kCopyBelow = 256;

// Appends `value` as a base-128 varint.
void PutVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

void PutTag(int field, WireType type, std::string* out) {
  PutVarint((static_cast<uint64_t>(field) << 3) | type, out);
}

// proto3 leaves out fields at their default; int32 is sign-extended to 64 bits.
void PutInt(int field, int64_t value, std::string* out) {
  if (value == 0) return;
  PutTag(field, kVarint, out);
  PutVarint(static_cast<uint64_t>(value), out);
}

grpc::Slice StringSlice(std::string bytes) {
  return grpc::Slice(bytes.data(), bytes.size());  // a few dozen bytes: copied
}

// The payload field's tag and length, then the payload; nothing for an empty payload.
void PutPayload(int field, const grpc::Slice& payload, std::string* header,
                std::vector<grpc::Slice>* slices) {
  if (payload.size() == 0) return;
  PutTag(field, kLengthDelimited, header);
  PutVarint(payload.size(), header);
  slices->push_back(StringSlice(std::move(*header)));
  header->clear();
  slices->push_back(payload);
}

grpc::ByteBuffer FromSlices(std::vector<grpc::Slice>& slices) {
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Reads protobuf's wire format off a Cord without flattening it.
class Reader {
 public:
  Reader(const char* message, const absl::Cord& cord)
      : message_(message), it_(cord.char_begin()), left_(cord.size()), size_(cord.size()) {}

  bool done() const { return left_ == 0; }
  size_t offset() const { return size_ - left_; }

  absl::Status Varint(uint64_t* value) {
    const size_t start = offset();
    uint64_t result = 0;
    for (size_t i = 0; i < kMaxVarint; ++i) {
      if (left_ == 0) return Error(start, "a varint runs past the end");
      const uint8_t byte = static_cast<uint8_t>(*it_);
      ++it_;
      --left_;
      result |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        *value = result;
        return absl::OkStatus();
      }
    }
    return Error(start, "a varint is longer than 10 bytes");
  }

  // A length-delimited field's bytes, by reference.
  absl::Status Bytes(absl::Cord* out) {
    const size_t start = offset();
    uint64_t length;
    if (absl::Status s = Varint(&length); !s.ok()) return s;
    if (length > left_) {
      return Error(start, absl::StrCat("a field of ", length, " bytes, but only ", left_,
                                       " are left"));
    }
    *out = absl::Cord::AdvanceAndRead(&it_, static_cast<size_t>(length));
    left_ -= static_cast<size_t>(length);
    return absl::OkStatus();
  }

  absl::Status Skip(WireType type) {
    const size_t start = offset();
    switch (type) {
      case kVarint: {
        uint64_t ignored;
        return Varint(&ignored);
      }
      case kFixed64:
      case kFixed32: {
        const size_t n = type == kFixed64 ? 8 : 4;
        if (n > left_) return Error(start, "a fixed-size field runs past the end");
        absl::Cord::Advance(&it_, n);
        left_ -= n;
        return absl::OkStatus();
      }
      case kLengthDelimited: {
        absl::Cord ignored;
        return Bytes(&ignored);
      }
    }
    return Error(start, "unknown wire type");
  }

  // The next field's number and wire type; an error for what proto3 cannot hold.
  absl::Status Tag(int* field, WireType* type) {
    const size_t start = offset();
    uint64_t tag;
    if (absl::Status s = Varint(&tag); !s.ok()) return s;
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number == 0 || number > (1u << 29) - 1) {
      return Error(start, absl::StrCat("field number ", number, " is outside [1, 2^29)"));
    }
    if (wire_type == 3 || wire_type == 4) {
      return Error(start, "a group (wire type 3/4); proto3 messages have none");
    }
    if (wire_type > 5) return Error(start, absl::StrCat("wire type ", wire_type, " is invalid"));
    *field = static_cast<int>(number);
    *type = static_cast<WireType>(wire_type);
    return absl::OkStatus();
  }

 private:
  absl::Status Error(size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message_, " at byte ", at, " of ", size_, ": ", what));
  }

  const char* message_;
  absl::Cord::CharIterator it_;
  size_t left_;
  const size_t size_;
};

}  // namespace

grpc::ByteBuffer EncodePush(int32_t worker, int64_t step, int32_t chunk, int32_t kind,
                            bool checkpoint, const grpc::Slice& payload, bool reset_errors) {
  std::string header;
  PutInt(1, worker, &header);
  PutInt(2, step, &header);
  PutInt(3, chunk, &header);
  PutInt(4, kind, &header);
  std::vector<grpc::Slice> slices;
  PutPayload(5, payload, &header, &slices);
  PutInt(6, checkpoint ? 1 : 0, &header);
  PutInt(7, reset_errors ? 1 : 0, &header);
  if (!header.empty() || slices.empty()) slices.push_back(StringSlice(std::move(header)));
  return FromSlices(slices);
}

grpc::ByteBuffer EncodeResult(int64_t step, int32_t chunk, int32_t kind,
                              const grpc::Slice& payload) {
  std::string header;
  PutInt(1, step, &header);
  PutInt(2, chunk, &header);
  PutInt(3, kind, &header);
  std::vector<grpc::Slice> slices;
  PutPayload(4, payload, &header, &slices);
  if (!header.empty() || slices.empty()) slices.push_back(StringSlice(std::move(header)));
  return FromSlices(slices);
}

grpc::Slice SharedSlice(std::shared_ptr<const std::string> bytes) {
  auto* keep = new std::shared_ptr<const std::string>(std::move(bytes));
  // gRPC never writes through the pointer: the slice is read-only to it.
  return grpc::Slice(const_cast<char*>((*keep)->data()), (*keep)->size(),
                     [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); },
                     keep);
}

grpc::Slice OwnedSlice(std::shared_ptr<const void> owner, const void* data, size_t size) {
  auto* keep = new std::shared_ptr<const void>(std::move(owner));
  return grpc::Slice(const_cast<void*>(data), size,
                     [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }, keep);
}

absl::Cord ToCord(const grpc::ByteBuffer& buffer) {
  absl::Cord cord;
  std::vector<grpc::Slice> slices;
  if (!buffer.Valid() || !buffer.Dump(&slices).ok()) return cord;
  for (grpc::Slice& slice : slices) {
    const absl::string_view bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
    // gRPC keeps small slices inline in the grpc_slice itself, so their bytes move with
    // the object: copy those (headers). A large slice's bytes stay put while referenced.
    if (bytes.size() <= kCopyBelow) {
      cord.Append(bytes);
    } else {
      cord.Append(absl::MakeCordFromExternal(bytes, [keep = std::move(slice)] {}));
    }
  }
  return cord;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  return std::string(ToCord(buffer));
}

absl::StatusOr<PushFields> ParsePush(const absl::Cord& message) {
  Reader reader("PushChunk", message);
  PushFields out;
  while (!reader.done()) {
    int field;
    WireType type;
    if (absl::Status s = reader.Tag(&field, &type); !s.ok()) return s;
    const bool varint_field =
        field == 1 || field == 2 || field == 3 || field == 4 || field == 6 || field == 7;
    if (varint_field && type == kVarint) {
      uint64_t value;
      if (absl::Status s = reader.Varint(&value); !s.ok()) return s;
      switch (field) {
        case 1: out.worker = static_cast<int32_t>(value); break;
        case 2: out.step = static_cast<int64_t>(value); break;
        case 3: out.chunk = static_cast<int32_t>(value); break;
        case 4: out.kind = static_cast<int32_t>(value); break;
        case 6: out.checkpoint = value != 0; break;
        case 7: out.reset_errors = value != 0; break;
      }
    } else if (field == 5 && type == kLengthDelimited) {
      if (absl::Status s = reader.Bytes(&out.payload); !s.ok()) return s;
    } else if (absl::Status s = reader.Skip(type); !s.ok()) {
      return s;
    }
  }
  return out;
}

absl::StatusOr<ResultFields> ParseResult(const absl::Cord& message) {
  Reader reader("ChunkResult", message);
  ResultFields out;
  while (!reader.done()) {
    int field;
    WireType type;
    if (absl::Status s = reader.Tag(&field, &type); !s.ok()) return s;
    if (field >= 1 && field <= 3 && type == kVarint) {
      uint64_t value;
      if (absl::Status s = reader.Varint(&value); !s.ok()) return s;
      switch (field) {
        case 1: out.step = static_cast<int64_t>(value); break;
        case 2: out.chunk = static_cast<int32_t>(value); break;
        case 3: out.kind = static_cast<int32_t>(value); break;
      }
    } else if (field == 4 && type == kLengthDelimited) {
      if (absl::Status s = reader.Bytes(&out.payload); !s.ok()) return s;
    } else if (absl::Status s = reader.Skip(type); !s.ok()) {
      return s;
    }
  }
  return out;
}

void CopyTo(const absl::Cord& cord, void* dst) {
  char* out = static_cast<char*>(dst);
  for (absl::string_view chunk : cord.Chunks()) {
    std::memcpy(out, chunk.data(), chunk.size());
    out += chunk.size();
  }
}

}  // namespace onebit::wire
