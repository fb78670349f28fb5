#include "checkpoint/part.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"

namespace onebit::checkpoint {
namespace {

constexpr uint8_t kDtypeFloat32 = 1;
constexpr size_t kMagicBytes = 8;
// Magic, version and body length.
constexpr size_t kHeader = kMagicBytes + sizeof(uint32_t) + sizeof(uint64_t);

void AppendRaw(std::string* out, const void* data, size_t size) {
  out->append(static_cast<const char*>(data), size);
}
void AppendU32(std::string* out, uint32_t v) { AppendRaw(out, &v, sizeof(v)); }
void AppendU64(std::string* out, uint64_t v) { AppendRaw(out, &v, sizeof(v)); }
void AppendString(std::string* out, const std::string& s) {
  AppendU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}

absl::Status Truncated(absl::string_view what, uint64_t size, uint64_t left) {
  return absl::DataLossError(absl::StrCat("checkpoint part truncated in ", what, ": needs ", size,
                                          " bytes, ", left, " left"));
}

// Reads fixed fields from the front of a byte range (Reader) or of a stream with a known
// number of bytes left (StreamReader); every read checks the bytes left. Derived has
//   absl::Status Raw(void* out, size_t size, absl::string_view what);
//   absl::Status Skip(uint64_t size, absl::string_view what);
//   uint64_t left() const;
template <typename Derived>
class FieldReader {
 public:
  template <typename T>
  absl::StatusOr<T> Get(absl::string_view what) {
    T v;
    ONEBIT_RETURN_IF_ERROR(derived().Raw(&v, sizeof(v), what));
    return v;
  }
  absl::StatusOr<std::string> String(absl::string_view what) {
    ONEBIT_ASSIGN_OR_RETURN(uint32_t len, Get<uint32_t>(what));
    if (len > kMaxPartNameBytes) {
      return absl::DataLossError(
          absl::StrCat("checkpoint part: ", what, " of ", len, " bytes (limit ", kMaxPartNameBytes, ")"));
    }
    std::string s(std::min<uint64_t>(len, derived().left()), '\0');
    ONEBIT_RETURN_IF_ERROR(derived().Raw(s.data(), len, what));
    return s;
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
};

class Reader : public FieldReader<Reader> {
 public:
  explicit Reader(absl::string_view bytes) : rest_(bytes) {}

  absl::Status Raw(void* out, size_t size, absl::string_view what) {
    if (rest_.size() < size) return Truncated(what, size, rest_.size());
    // An empty tensor's out is null, and memcpy's arguments must not be, even for 0 bytes.
    if (size > 0) std::memcpy(out, rest_.data(), size);
    rest_.remove_prefix(size);
    return absl::OkStatus();
  }
  absl::Status Skip(uint64_t size, absl::string_view what) {
    if (rest_.size() < size) return Truncated(what, size, rest_.size());
    rest_.remove_prefix(size);
    return absl::OkStatus();
  }
  uint64_t left() const { return rest_.size(); }

 private:
  absl::string_view rest_;
};

class StreamReader : public FieldReader<StreamReader> {
 public:
  StreamReader(std::istream& in, uint64_t left) : in_(in), left_(left) {}

  absl::Status Raw(void* out, size_t size, absl::string_view what) {
    if (left_ < size) return Truncated(what, size, left_);
    if (size > 0 && !in_.read(static_cast<char*>(out), static_cast<std::streamsize>(size))) {
      return absl::DataLossError(absl::StrCat("checkpoint part: cannot read ", what));
    }
    left_ -= size;
    return absl::OkStatus();
  }
  absl::Status Skip(uint64_t size, absl::string_view what) {
    if (left_ < size) return Truncated(what, size, left_);
    if (!in_.seekg(static_cast<std::streamoff>(size), std::ios::cur)) {
      return absl::DataLossError(absl::StrCat("checkpoint part: cannot skip ", what));
    }
    left_ -= size;
    return absl::OkStatus();
  }
  uint64_t left() const { return left_; }

 private:
  std::istream& in_;
  uint64_t left_;
};

// The body's entries. With `data` false the tensors' elements are skipped: each tensor
// keeps its shape and an empty `data`.
template <typename R>
absl::StatusOr<Part> DecodeBody(R& r, bool data) {
  Part part;
  ONEBIT_ASSIGN_OR_RETURN(uint32_t num_meta, r.template Get<uint32_t>("meta count"));
  if (num_meta > kMaxPartEntries) {
    return absl::DataLossError(absl::StrCat("checkpoint part: ", num_meta, " meta entries"));
  }
  for (uint32_t i = 0; i < num_meta; ++i) {
    ONEBIT_ASSIGN_OR_RETURN(std::string key, r.String("meta key"));
    ONEBIT_ASSIGN_OR_RETURN(std::string value, r.String("meta value"));
    if (!part.meta.emplace(std::move(key), std::move(value)).second) {
      return absl::DataLossError("checkpoint part: a meta key appears twice");
    }
  }
  ONEBIT_ASSIGN_OR_RETURN(uint32_t num_tensors, r.template Get<uint32_t>("tensor count"));
  if (num_tensors > kMaxPartEntries) {
    return absl::DataLossError(absl::StrCat("checkpoint part: ", num_tensors, " tensors"));
  }
  for (uint32_t i = 0; i < num_tensors; ++i) {
    ONEBIT_ASSIGN_OR_RETURN(std::string name, r.String("tensor name"));
    ONEBIT_ASSIGN_OR_RETURN(uint8_t dtype, r.template Get<uint8_t>("dtype"));
    if (dtype != kDtypeFloat32) {
      return absl::DataLossError(
          absl::StrCat("checkpoint part: tensor '", name, "' has unknown dtype ", dtype));
    }
    ONEBIT_ASSIGN_OR_RETURN(uint32_t ndim, r.template Get<uint32_t>("ndim"));
    if (ndim > kMaxPartDims) {
      return absl::DataLossError(absl::StrCat("checkpoint part: tensor '", name, "' has ", ndim, " dims"));
    }
    Tensor t;
    for (uint32_t d = 0; d < ndim; ++d) {
      ONEBIT_ASSIGN_OR_RETURN(uint64_t dim, r.template Get<uint64_t>("shape"));
      t.shape.push_back(dim);
    }
    // A zero dimension makes the tensor empty whatever the others are (EncodePart writes
    // such shapes). Otherwise the product is bounded by the bytes left, so it cannot
    // overflow and the allocation below is never larger than the input.
    const uint64_t max_elements = r.left() / sizeof(float);
    uint64_t elements = std::count(t.shape.begin(), t.shape.end(), uint64_t{0}) > 0 ? 0 : 1;
    for (uint64_t dim : t.shape) {
      if (elements == 0) break;
      if (elements > max_elements / dim) {
        return absl::DataLossError(absl::StrCat("checkpoint part: tensor '", name,
                                                "' is larger than the file"));
      }
      elements *= dim;
    }
    if (elements > r.left() / sizeof(float)) {
      return absl::DataLossError(absl::StrCat("checkpoint part truncated in tensor '", name, "': ",
                                              elements, " floats, ", r.left(), " bytes left"));
    }
    if (data) {
      t.data.resize(elements);
      ONEBIT_RETURN_IF_ERROR(r.Raw(t.data.data(), elements * sizeof(float), name));
    } else {
      ONEBIT_RETURN_IF_ERROR(r.Skip(elements * sizeof(float), name));
    }
    if (!part.tensors.emplace(std::move(name), std::move(t)).second) {
      return absl::DataLossError("checkpoint part: a tensor name appears twice");
    }
  }
  if (r.left() != 0) {
    return absl::DataLossError(absl::StrCat("checkpoint part: ", r.left(), " stray bytes after the tensors"));
  }
  return part;
}

}  // namespace

void Part::Put(const std::string& name, std::vector<float> data) {
  Tensor t;
  t.shape = {data.size()};
  t.data = std::move(data);
  tensors[name] = std::move(t);
}

absl::StatusOr<const Tensor*> Part::Get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) return absl::NotFoundError(absl::StrCat("checkpoint part has no tensor '", name, "'"));
  return &it->second;
}

absl::StatusOr<int64_t> Part::MetaInt(const std::string& key) const {
  auto it = meta.find(key);
  if (it == meta.end()) return absl::NotFoundError(absl::StrCat("checkpoint part has no meta '", key, "'"));
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::DataLossError(absl::StrCat("checkpoint part meta '", key, "' is not an integer: '",
                                            it->second.substr(0, 64), "'"));
  }
  return v;
}

void Part::PutMetaInt(const std::string& key, int64_t value) { meta[key] = absl::StrCat(value); }

uint32_t Crc32(absl::string_view bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes uInt lengths: feed large inputs in pieces.
  while (!bytes.empty()) {
    const size_t piece = std::min<size_t>(bytes.size(), 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(piece));
    bytes.remove_prefix(piece);
  }
  return static_cast<uint32_t>(crc);
}

namespace {

// The file as pieces: small headers of our own, and views of the tensors' data (no copy of
// the large arrays), in file order, with the CRC-32 trailer last.
struct Encoded {
  std::vector<std::string> headers;  // owned storage for the small pieces
  std::vector<absl::string_view> pieces;
  uint64_t bytes = 0;
};

void Encode(const Part& part, Encoded* e) {
  size_t body_bytes = 2 * sizeof(uint32_t);
  for (const auto& [key, value] : part.meta) body_bytes += 2 * sizeof(uint32_t) + key.size() + value.size();
  for (const auto& [name, t] : part.tensors) {
    body_bytes += 2 * sizeof(uint32_t) + name.size() + 1 + t.shape.size() * sizeof(uint64_t) +
                  t.data.size() * sizeof(float);
  }
  e->headers.reserve(part.tensors.size() + 2);
  std::string head(kPartMagic, kMagicBytes);
  AppendU32(&head, kPartVersion);
  AppendU64(&head, body_bytes);
  AppendU32(&head, static_cast<uint32_t>(part.meta.size()));
  for (const auto& [key, value] : part.meta) {
    AppendString(&head, key);
    AppendString(&head, value);
  }
  AppendU32(&head, static_cast<uint32_t>(part.tensors.size()));
  e->headers.push_back(std::move(head));
  std::vector<std::pair<size_t, const Tensor*>> order;  // header index, tensor
  for (const auto& [name, t] : part.tensors) {
    std::string h;
    AppendString(&h, name);
    h.push_back(static_cast<char>(kDtypeFloat32));
    AppendU32(&h, static_cast<uint32_t>(t.shape.size()));
    for (uint64_t d : t.shape) AppendU64(&h, d);
    e->headers.push_back(std::move(h));
    order.emplace_back(e->headers.size() - 1, &t);
  }
  e->pieces.push_back(e->headers[0]);
  for (const auto& [index, t] : order) {
    e->pieces.push_back(e->headers[index]);
    e->pieces.emplace_back(reinterpret_cast<const char*>(t->data.data()), t->data.size() * sizeof(float));
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (absl::string_view piece : e->pieces) {
    while (!piece.empty()) {
      const size_t n = std::min<size_t>(piece.size(), 1u << 30);
      crc = crc32(crc, reinterpret_cast<const Bytef*>(piece.data()), static_cast<uInt>(n));
      piece.remove_prefix(n);
    }
  }
  std::string trailer;
  AppendU32(&trailer, static_cast<uint32_t>(crc));
  e->headers.push_back(std::move(trailer));
  e->pieces.push_back(e->headers.back());
  for (absl::string_view piece : e->pieces) e->bytes += piece.size();
}

}  // namespace

std::string EncodePart(const Part& part) {
  Encoded e;
  Encode(part, &e);
  std::string out;
  out.reserve(e.bytes);
  for (absl::string_view piece : e.pieces) out.append(piece.data(), piece.size());
  return out;
}

absl::StatusOr<Part> DecodePart(absl::string_view bytes) {
  if (bytes.size() < kMagicBytes || bytes.substr(0, kMagicBytes) != absl::string_view(kPartMagic, kMagicBytes)) {
    return absl::InvalidArgumentError("not a onebit checkpoint part (bad magic)");
  }
  if (bytes.size() < kHeader + sizeof(uint32_t)) {
    return absl::DataLossError(absl::StrCat("checkpoint part truncated: ", bytes.size(), " bytes"));
  }
  Reader header(bytes.substr(kMagicBytes));
  ONEBIT_ASSIGN_OR_RETURN(uint32_t version, header.Get<uint32_t>("version"));
  if (version != kPartVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part version ", version, " (this build reads ", kPartVersion, ")"));
  }
  ONEBIT_ASSIGN_OR_RETURN(uint64_t body_bytes, header.Get<uint64_t>("length"));
  const size_t available = bytes.size() - kHeader - sizeof(uint32_t);
  if (body_bytes != available) {
    return absl::DataLossError(absl::StrCat("checkpoint part truncated or padded: header says ",
                                            body_bytes, " body bytes, file has ", available));
  }
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof(uint32_t), sizeof(stored));
  const uint32_t actual = Crc32(bytes.substr(0, bytes.size() - sizeof(uint32_t)));
  if (stored != actual) {
    return absl::DataLossError(absl::StrCat("checkpoint part checksum mismatch: stored ", stored,
                                            ", computed ", actual));
  }
  Reader body(bytes.substr(kHeader, body_bytes));
  return DecodeBody(body, /*data=*/true);
}

namespace {
absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::move(ss).str();
}
}  // namespace

absl::StatusOr<WrittenFile> WritePart(const std::string& path, const Part& part) {
  Encoded e;
  Encode(part, &e);
  ONEBIT_RETURN_IF_ERROR(WriteFileAtomically(path, e.pieces));
  // The whole file's CRC extends the one stored in its last four bytes.
  const absl::string_view trailer = e.pieces.back();
  uint32_t inner;
  std::memcpy(&inner, trailer.data(), sizeof(inner));
  const uLong whole = crc32(inner, reinterpret_cast<const Bytef*>(trailer.data()), 4);
  return WrittenFile{e.bytes, static_cast<uint32_t>(whole)};
}

absl::StatusOr<Part> ReadPart(const std::string& path) {
  ONEBIT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  absl::StatusOr<Part> part = DecodePart(bytes);
  if (!part.ok()) {
    return absl::Status(part.status().code(), absl::StrCat(path, ": ", part.status().message()));
  }
  return part;
}

namespace {
absl::StatusOr<Part> DecodeHead(std::istream& in) {
  if (!in.seekg(0, std::ios::end)) return absl::DataLossError("cannot find the file's size");
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  char magic[kMagicBytes] = {};
  if (size < kMagicBytes || !in.read(magic, kMagicBytes) ||
      absl::string_view(magic, kMagicBytes) != absl::string_view(kPartMagic, kMagicBytes)) {
    return absl::InvalidArgumentError("not a onebit checkpoint part (bad magic)");
  }
  if (size < kHeader + sizeof(uint32_t)) {
    return absl::DataLossError(absl::StrCat("checkpoint part truncated: ", size, " bytes"));
  }
  StreamReader header(in, kHeader - kMagicBytes);
  ONEBIT_ASSIGN_OR_RETURN(uint32_t version, header.Get<uint32_t>("version"));
  if (version != kPartVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint part version ", version, " (this build reads ", kPartVersion, ")"));
  }
  ONEBIT_ASSIGN_OR_RETURN(uint64_t body_bytes, header.Get<uint64_t>("length"));
  const uint64_t available = size - kHeader - sizeof(uint32_t);
  if (body_bytes != available) {
    return absl::DataLossError(absl::StrCat("checkpoint part truncated or padded: header says ",
                                            body_bytes, " body bytes, file has ", available));
  }
  StreamReader body(in, body_bytes);
  return DecodeBody(body, /*data=*/false);
}
}  // namespace

absl::StatusOr<Part> ReadPartHead(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  absl::StatusOr<Part> part = DecodeHead(in);
  if (!part.ok()) {
    return absl::Status(part.status().code(), absl::StrCat(path, ": ", part.status().message()));
  }
  return part;
}

absl::StatusOr<WrittenFile> ChecksumFile(const std::string& path) {
  ONEBIT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return WrittenFile{bytes.size(), Crc32(bytes)};
}

}  // namespace onebit::checkpoint
