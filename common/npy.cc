#include "common/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/atomic_file.h"

// The payload is copied to and from memory as is.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "npy.cc assumes a little-endian host");

namespace onebit::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr char kFloat32Descr[] = "<f4";

absl::Status ErrnoError(const std::string& path, absl::string_view what, int err) {
  std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

absl::Status FormatError(const std::string& path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", problem));
}

// Reads exactly `size` bytes at `offset`; `*got` is how many were available.
absl::Status PreadFully(int fd, const std::string& path, void* buf, size_t size, off_t offset,
                        size_t* got) {
  auto* out = static_cast<char*>(buf);
  size_t done = 0;
  while (done < size) {
    ssize_t r = pread(fd, out + done, size - done, offset + static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path, "read failed", errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  *got = done;
  return absl::OkStatus();
}

// Printable form of raw header bytes for error messages.
std::string Escaped(absl::string_view bytes, size_t limit = 80) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < limit; ++i) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrCat("\\x", absl::Hex(c, absl::kZeroPad2));
    }
  }
  if (bytes.size() > limit) out += "...";
  return out;
}

// "'<f8' (float64)": the descr and, when it is a plain numeric type, what it means.
std::string DescribeDescr(const std::string& descr) {
  std::string quoted = absl::StrCat("'", descr, "'");
  if (descr.size() < 3) return quoted;
  char order = descr[0];
  char kind = descr[1];
  int size = 0;
  for (size_t i = 2; i < descr.size(); ++i) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(descr[i])) || size > 1000) return quoted;
    size = size * 10 + (descr[i] - '0');
  }
  const char* kind_name = nullptr;
  switch (kind) {
    case 'f': kind_name = "float"; break;
    case 'i': kind_name = "int"; break;
    case 'u': kind_name = "uint"; break;
    case 'c': kind_name = "complex"; break;
    case 'b': return absl::StrCat(quoted, " (bool)");
    default: return quoted;
  }
  std::string name = absl::StrCat(kind_name, size * 8);
  if (order == '>') name = absl::StrCat("big-endian ", name);
  return absl::StrCat(quoted, " (", name, ")");
}

// A parser for the Python literal dict in a .npy header, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// It accepts what numpy writes (and what Python's literal_eval would accept for these three
// keys): strings in single or double quotes, True/False, tuples of non-negative integers
// (with Python 2's optional L suffix).
class HeaderParser {
 public:
  struct Value {
    enum Kind { kString, kBool, kTuple } kind;
    std::string str;
    bool boolean = false;
    std::vector<int64_t> tuple;
  };

  explicit HeaderParser(absl::string_view text) : text_(text) {}

  // On failure returns false and sets *error.
  bool Parse(std::map<std::string, Value>* dict, std::string* error) {
    SkipSpace();
    if (!Consume('{')) return Fail("expected '{' at the start of the header dict", error);
    SkipSpace();
    while (!Consume('}')) {
      std::string key;
      if (!ParseString(&key)) return Fail("expected a quoted key", error);
      SkipSpace();
      if (!Consume(':')) return Fail(absl::StrCat("expected ':' after key '", key, "'"), error);
      SkipSpace();
      Value value;
      if (!ParseValue(&value, error)) return false;
      if (!dict->emplace(key, std::move(value)).second) {
        return Fail(absl::StrCat("duplicate key '", key, "'"), error);
      }
      SkipSpace();
      if (Consume(',')) {
        SkipSpace();
        continue;
      }
      SkipSpace();
      if (Peek() != '}') return Fail("expected ',' or '}'", error);
    }
    SkipSpace();
    if (pos_ != text_.size()) {
      return Fail("unexpected characters after the header dict", error);
    }
    return true;
  }

 private:
  bool Fail(absl::string_view what, std::string* error) {
    *error = absl::StrCat(what, " at offset ", pos_, " of header \"", Escaped(text_), "\"");
    return false;
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool ParseString(std::string* out) {
    char quote = Peek();
    if (quote != '\'' && quote != '"') return false;
    size_t end = text_.find(quote, pos_ + 1);
    if (end == absl::string_view::npos) return false;
    absl::string_view body = text_.substr(pos_ + 1, end - pos_ - 1);
    if (body.find('\\') != absl::string_view::npos) return false;  // numpy never escapes
    *out = std::string(body);
    pos_ = end + 1;
    return true;
  }
  bool ParseInt(int64_t* out) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) return false;
    int64_t v = 0;
    while (absl::ascii_isdigit(static_cast<unsigned char>(Peek()))) {
      int digit = text_[pos_] - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) return false;
      v = v * 10 + digit;
      ++pos_;
    }
    Consume('L');  // Python 2's long suffix
    *out = v;
    return true;
  }
  bool ParseValue(Value* value, std::string* error) {
    char c = Peek();
    if (c == '\'' || c == '"') {
      value->kind = Value::kString;
      if (!ParseString(&value->str)) return Fail("unterminated string", error);
      return true;
    }
    if (text_.substr(pos_, 4) == "True") {
      value->kind = Value::kBool;
      value->boolean = true;
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      value->kind = Value::kBool;
      value->boolean = false;
      pos_ += 5;
      return true;
    }
    if (c == '(') {
      ++pos_;
      value->kind = Value::kTuple;
      SkipSpace();
      bool trailing_comma = false;
      while (!Consume(')')) {
        int64_t dim;
        if (!ParseInt(&dim)) {
          return Fail("expected a non-negative integer in the shape tuple", error);
        }
        value->tuple.push_back(dim);
        SkipSpace();
        trailing_comma = Consume(',');
        SkipSpace();
        if (!trailing_comma && Peek() != ')') {
          return Fail("expected ',' or ')' in the shape tuple", error);
        }
      }
      // "(3)" is the integer 3 in Python, not a tuple.
      if (value->tuple.size() == 1 && !trailing_comma) {
        return Fail("shape '(n)' is not a tuple (numpy writes '(n,)')", error);
      }
      return true;
    }
    if (c == '[') return Fail("structured dtypes (a list descr) are not supported", error);
    return Fail("expected a string, True, False or a tuple", error);
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

std::string BuildHeader(const std::vector<int64_t>& shape, int* major) {
  std::string dict = absl::StrCat("{'descr': '", kFloat32Descr,
                                  "', 'fortran_order': False, 'shape': ", ShapeToString(shape),
                                  ", }");
  // Version 1.0 has a 2-byte header length; 2.0 a 4-byte one. The whole preamble plus
  // header is padded with spaces to a multiple of 64 bytes and ends with '\n'.
  *major = 1;
  size_t prefix = kMagicSize + 2 + 2;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  if (total - prefix > 65535) {
    *major = 2;
    prefix = kMagicSize + 2 + 4;
    total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  }
  size_t header_len = total - prefix;
  std::string out(kMagic, kMagicSize);
  out.push_back(static_cast<char>(*major));
  out.push_back(0);
  for (int i = 0; i < (*major == 1 ? 2 : 4); ++i) {
    out.push_back(static_cast<char>((header_len >> (8 * i)) & 0xff));
  }
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out.push_back('\n');
  return out;
}

}  // namespace

std::string ShapeToString(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::Status CheckShape(const std::string& path, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& expected) {
  bool ok = shape.size() == expected.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    ok = expected[i] == kAnyDim || expected[i] == shape[i];
  }
  if (ok) return absl::OkStatus();
  std::vector<std::string> dims;
  for (int64_t d : expected) dims.push_back(d == kAnyDim ? "*" : absl::StrCat(d));
  std::string want = dims.size() == 1 ? absl::StrCat("(", dims[0], ",)")
                                      : absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
  return FormatError(path, absl::StrCat("shape mismatch: found ", ShapeToString(shape),
                                        ", expected ", want));
}

Float32Reader::Float32Reader(std::string path, int fd, std::vector<int64_t> shape,
                             int64_t num_elements, int64_t data_offset)
    : path_(std::move(path)),
      fd_(fd),
      shape_(std::move(shape)),
      num_elements_(num_elements),
      data_offset_(data_offset) {}

Float32Reader::~Float32Reader() { close(fd_); }

namespace {

// An open, validated file: the caller owns fd.
struct OpenedArray {
  int fd = -1;
  std::string descr;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  int64_t data_offset = 0;
};

// Opens and validates `path` holding one of `dtypes` (descr -> element bytes); `expected`
// says what a wrong dtype should have been.
absl::StatusOr<OpenedArray> OpenArray(const std::string& path,
                                      const std::map<std::string, int>& dtypes,
                                      absl::string_view expected) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open", errno);
  // Owns fd until the reader does.
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) close(fd);
    }
  } closer{fd};

  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoError(path, "cannot stat", errno);
  if (!S_ISREG(st.st_mode)) return FormatError(path, "not a regular file");
  const int64_t file_size = st.st_size;

  char preamble[kMagicSize + 2 + 4];
  size_t got = 0;
  absl::Status status = PreadFully(fd, path, preamble, sizeof(preamble), 0, &got);
  if (!status.ok()) return status;
  if (got < kMagicSize || std::memcmp(preamble, kMagic, kMagicSize) != 0) {
    return FormatError(path, absl::StrCat("bad magic: not a .npy file (starts with \"",
                                          Escaped(absl::string_view(preamble, got), 8),
                                          "\", expected \"\\x93NUMPY\")"));
  }
  if (got < kMagicSize + 2) return FormatError(path, "truncated header: no version bytes");
  const int major = static_cast<unsigned char>(preamble[6]);
  const int minor = static_cast<unsigned char>(preamble[7]);
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    return FormatError(path, absl::StrCat("unsupported .npy format version ", major, ".", minor,
                                          " (supported: 1.0, 2.0, 3.0)"));
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (got < kMagicSize + 2 + len_bytes) {
    return FormatError(path, "truncated header: no header length");
  }
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i) {
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(preamble[8 + i])) << (8 * i);
  }
  const int64_t header_start = static_cast<int64_t>(kMagicSize + 2 + len_bytes);
  if (static_cast<int64_t>(header_len) > file_size - header_start) {
    return FormatError(path, absl::StrCat("truncated header: header length is ", header_len,
                                          " bytes but the file has only ",
                                          file_size - header_start, " after the preamble"));
  }
  std::string header(header_len, '\0');
  status = PreadFully(fd, path, header.data(), header_len, header_start, &got);
  if (!status.ok()) return status;
  if (got != header_len) return FormatError(path, "truncated header (file shrank?)");

  std::map<std::string, HeaderParser::Value> dict;
  std::string error;
  if (!HeaderParser(header).Parse(&dict, &error)) {
    return FormatError(path, absl::StrCat("malformed header dict: ", error));
  }
  for (const auto& [key, value] : dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      return FormatError(path, absl::StrCat("malformed header dict: unexpected key '", key,
                                            "' (expected descr, fortran_order, shape)"));
    }
  }
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (dict.count(key) == 0) {
      return FormatError(path, absl::StrCat("malformed header dict: missing key '", key, "'"));
    }
  }
  const HeaderParser::Value& descr = dict["descr"];
  const HeaderParser::Value& fortran = dict["fortran_order"];
  const HeaderParser::Value& shape_value = dict["shape"];
  if (descr.kind != HeaderParser::Value::kString) {
    return FormatError(path, "malformed header dict: 'descr' is not a string");
  }
  if (fortran.kind != HeaderParser::Value::kBool) {
    return FormatError(path, "malformed header dict: 'fortran_order' is not True or False");
  }
  if (shape_value.kind != HeaderParser::Value::kTuple) {
    return FormatError(path, "malformed header dict: 'shape' is not a tuple");
  }
  const auto dtype = dtypes.find(descr.str);
  if (dtype == dtypes.end()) {
    return FormatError(path, absl::StrCat("wrong dtype: found ", DescribeDescr(descr.str),
                                          ", expected ", expected));
  }
  const int element_bytes = dtype->second;
  if (fortran.boolean) {
    return FormatError(path,
                       "fortran_order is True: only C-order arrays are supported (save "
                       "numpy.ascontiguousarray(a))");
  }

  const std::vector<int64_t>& shape = shape_value.tuple;
  int64_t num_elements = 1;
  const int64_t data_offset = header_start + static_cast<int64_t>(header_len);
  const int64_t max_elements =
      (std::numeric_limits<int64_t>::max() - data_offset) / element_bytes;
  for (int64_t d : shape) {
    if (d != 0 && num_elements > max_elements / d) {
      return FormatError(path, absl::StrCat("shape ", ShapeToString(shape), " is too large"));
    }
    num_elements *= d;
  }
  const int64_t expected_bytes = num_elements * element_bytes;
  const int64_t found_bytes = file_size - data_offset;
  if (found_bytes < expected_bytes) {
    return FormatError(path, absl::StrCat("truncated data: shape ", ShapeToString(shape),
                                          " ", descr.str == kFloat32Descr ? "float32" : descr.str, " needs ", expected_bytes,
                                          " bytes of data, found ", found_bytes));
  }
  if (found_bytes > expected_bytes) {
    return FormatError(path, absl::StrCat("trailing garbage: ", found_bytes - expected_bytes,
                                          " bytes after the ", expected_bytes,
                                          " bytes of data of shape ", ShapeToString(shape)));
  }
  closer.fd = -1;
  return OpenedArray{fd, descr.str, shape, num_elements, data_offset};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Float32Reader>> Float32Reader::Open(const std::string& path) {
  absl::StatusOr<OpenedArray> a =
      OpenArray(path, {{kFloat32Descr, 4}}, "'<f4' (little-endian float32)");
  if (!a.ok()) return a.status();
  return std::unique_ptr<Float32Reader>(
      new Float32Reader(path, a->fd, a->shape, a->num_elements, a->data_offset));
}

absl::Status Float32Reader::ReadElements(int64_t offset, int64_t count, float* out) const {
  if (offset < 0 || count < 0 || offset > num_elements_ || count > num_elements_ - offset) {
    // offset + count may overflow: add as unsigned (wrapping) for the message.
    const int64_t end =
        static_cast<int64_t>(static_cast<uint64_t>(offset) + static_cast<uint64_t>(count));
    return absl::OutOfRangeError(absl::StrCat(path_, ": elements [", offset, ", ", end,
                                              ") are outside the ",
                                              num_elements_, " elements of the array"));
  }
  size_t got = 0;
  const size_t bytes = static_cast<size_t>(count) * 4;
  absl::Status status =
      PreadFully(fd_, path_, out, bytes, static_cast<off_t>(data_offset_ + offset * 4), &got);
  if (!status.ok()) return status;
  if (got != bytes) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated data: expected ", bytes,
                                            " bytes at element ", offset, ", found ", got,
                                            " (the file changed while open?)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Float32Array> ReadFloat32(const std::string& path,
                                         const std::vector<int64_t>& expected_shape) {
  absl::StatusOr<std::unique_ptr<Float32Reader>> reader = Float32Reader::Open(path);
  if (!reader.ok()) return reader.status();
  if (!expected_shape.empty()) {
    absl::Status status = CheckShape(path, (*reader)->shape(), expected_shape);
    if (!status.ok()) return status;
  }
  Float32Array array;
  array.shape = (*reader)->shape();
  array.data.resize(static_cast<size_t>((*reader)->num_elements()));
  absl::Status status = (*reader)->ReadElements(0, (*reader)->num_elements(), array.data.data());
  if (!status.ok()) return status;
  return array;
}

absl::Status WriteFloat32(const std::string& path, const std::vector<int64_t>& shape,
                          const float* data) {
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot write negative shape ", ShapeToString(shape)));
    }
  }
  int major = 1;
  const std::string header = BuildHeader(shape, &major);
  const size_t data_bytes = static_cast<size_t>(NumElements(shape)) * 4;

  // Header and data handed over as they are: the array is not copied into one string.
  const absl::string_view pieces[] = {
      header, absl::string_view(reinterpret_cast<const char*>(data), data_bytes)};
  return WriteFileAtomically(path, pieces);
}

absl::StatusOr<Float32Array> ReadAsFloat32(const std::string& path, std::string* descr) {
  absl::StatusOr<OpenedArray> a =
      OpenArray(path, {{kFloat32Descr, 4}, {"|b1", 1}, {"|u1", 1}},
                "'<f4' (float32), '|b1' (bool) or '|u1' (uint8)");
  if (!a.ok()) return a.status();
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{a->fd};
  Float32Array array;
  array.shape = a->shape;
  array.data.resize(static_cast<size_t>(a->num_elements));
  const size_t element_bytes = a->descr == kFloat32Descr ? 4 : 1;
  std::vector<unsigned char> bytes(array.data.size() * element_bytes);
  size_t got = 0;
  absl::Status status = PreadFully(a->fd, path, bytes.data(), bytes.size(), a->data_offset, &got);
  if (!status.ok()) return status;
  if (got != bytes.size()) {
    return FormatError(path, "truncated data (the file changed while open?)");
  }
  if (element_bytes == 4) {
    std::memcpy(array.data.data(), bytes.data(), bytes.size());
  } else {
    for (size_t i = 0; i < bytes.size(); ++i) array.data[i] = static_cast<float>(bytes[i]);
  }
  if (descr != nullptr) *descr = a->descr;
  return array;
}

}  // namespace onebit::npy
