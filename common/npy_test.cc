#include "common/npy.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit::npy {
namespace {

using ::testing::HasSubstr;

std::string TmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string TmpPath(const std::string& name) {
  std::string dir = absl::StrCat(TmpDir(), "/npy_test");
  mkdir(dir.c_str(), 0777);
  return absl::StrCat(dir, "/", name);
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadRaw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

// A version 1.0 file with the given header dict (padded numpy's way) and payload.
std::string MakeNpy(const std::string& dict, const std::string& payload, int major = 1,
                    int minor = 0) {
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(static_cast<char>(minor));
  size_t prefix = major == 1 ? 10 : 12;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  size_t len = total - prefix;
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) {
    out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  }
  out += dict;
  out.append(len - dict.size() - 1, ' ');
  out.push_back('\n');
  return out + payload;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::string F4Dict(const std::string& shape) {
  return absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape, ", }");
}

// What numpy.save(f, numpy.array([1, 2, 3], dtype='<f4')) writes, byte for byte.
TEST(NpyTest, WritesNumpyBytes) {
  std::string path = TmpPath("numpy_bytes.npy");
  std::vector<float> v = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(WriteFloat32(path, {3}, v.data()).ok());
  std::string expected("\x93NUMPY\x01\x00\x76\x00", 10);
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  expected += dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
  expected += FloatBytes(v);
  EXPECT_EQ(ReadRaw(path), expected);
}

TEST(NpyTest, RoundTripsShapes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {0}, {1}, {7}, {3, 4}, {2, 0, 5}, {2, 3, 5}, {1, 1, 1, 1, 9}, {1001}};
  for (const auto& shape : shapes) {
    SCOPED_TRACE(ShapeToString(shape));
    std::vector<float> v(static_cast<size_t>(NumElements(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i)) * 1e3f;
    std::string path = TmpPath("round_trip.npy");
    ASSERT_TRUE(WriteFloat32(path, shape, v.data()).ok());
    // The header block is 64-byte aligned, as numpy writes it.
    EXPECT_EQ((ReadRaw(path).size() - v.size() * 4) % 64, 0u);
    absl::StatusOr<Float32Array> a = ReadFloat32(path);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->shape, shape);
    ASSERT_EQ(a->data.size(), v.size());
    // Bitwise; an empty vector's data() may be null, which memcmp must not see.
    if (!v.empty()) {
      EXPECT_EQ(std::memcmp(a->data.data(), v.data(), v.size() * 4), 0);
    }
  }
}

TEST(NpyTest, RoundTripsSpecialValues) {
  std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, 3.4028235e38f};
  std::string path = TmpPath("special.npy");
  ASSERT_TRUE(WriteFloat32(path, {static_cast<int64_t>(v.size())}, v.data()).ok());
  absl::StatusOr<Float32Array> a = ReadFloat32(path, {kAnyDim});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(std::memcmp(a->data.data(), v.data(), v.size() * 4), 0);
}

// A header longer than 64 KiB needs format 2.0 (4-byte length).
TEST(NpyTest, HugeHeaderUsesVersion2) {
  std::vector<int64_t> shape(30000, 1);
  std::string path = TmpPath("v2.npy");
  float x = 42.0f;
  ASSERT_TRUE(WriteFloat32(path, shape, &x).ok());
  std::string raw = ReadRaw(path);
  ASSERT_GT(raw.size(), 8u);
  EXPECT_EQ(raw[6], 2);
  absl::StatusOr<Float32Array> a = ReadFloat32(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->shape, shape);
  EXPECT_EQ(a->data, std::vector<float>{42.0f});
}

TEST(NpyTest, ReadsOtherWritersHeaders) {
  std::vector<float> v = {1.5f, -2.5f, 3.5f, 4.5f};
  struct Case {
    std::string name, bytes;
    std::vector<int64_t> shape;
  } cases[] = {
      {"v2", MakeNpy(F4Dict("(4,)"), FloatBytes(v), 2), {4}},
      {"v3", MakeNpy(F4Dict("(2, 2)"), FloatBytes(v), 3), {2, 2}},
      // Python 2 numpy: long suffix, keys in another order, no trailing comma, 16-byte pad.
      {"py2",
       std::string("\x93NUMPY\x01\x00\x46\x00", 10) +
           "{'shape': (4L,), 'fortran_order': False, 'descr': '<f4'}" +
           std::string(70 - 56 - 1, ' ') + "\n" + FloatBytes(v),
       {4}},
      {"double_quotes",
       MakeNpy("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (1, 4)}", FloatBytes(v)),
       {1, 4}},
      // numpy >= 1.23 leaves spare spaces after the dict.
      {"growth_space", MakeNpy(F4Dict("(4,)") + std::string(20, ' '), FloatBytes(v)), {4}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string path = TmpPath(c.name + ".npy");
    WriteRaw(path, c.bytes);
    absl::StatusOr<Float32Array> a = ReadFloat32(path);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->shape, c.shape);
    EXPECT_EQ(a->data, v);
  }
}

// Reads a hand-made file and expects an InvalidArgument error naming the file and
// containing every one of `parts`.
void ExpectFormatError(const std::string& name, const std::string& bytes,
                       const std::vector<std::string>& parts,
                       const std::vector<int64_t>& expected_shape = {}) {
  SCOPED_TRACE(name);
  std::string path = TmpPath(name + ".npy");
  WriteRaw(path, bytes);
  absl::StatusOr<Float32Array> a = ReadFloat32(path, expected_shape);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(part));
  }
}

TEST(NpyErrorTest, MissingFile) {
  std::string path = TmpPath("does_not_exist.npy");
  absl::StatusOr<Float32Array> a = ReadFloat32(path);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("No such file"));
}

TEST(NpyErrorTest, Directory) {
  std::string path = TmpPath("a_directory");
  mkdir(path.c_str(), 0777);
  absl::StatusOr<Float32Array> a = ReadFloat32(path);
  ASSERT_FALSE(a.ok());
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("not a regular file"));
}

TEST(NpyErrorTest, BadMagic) {
  ExpectFormatError("empty", "", {"bad magic"});
  ExpectFormatError("short", "\x93NU", {"bad magic"});
  ExpectFormatError("text", "hello, world, this is not numpy\n", {"bad magic", "hello"});
  std::string npz = MakeNpy(F4Dict("(1,)"), FloatBytes({1}));
  npz[0] = 'P';
  ExpectFormatError("wrong_first_byte", npz, {"bad magic"});
}

TEST(NpyErrorTest, UnsupportedVersion) {
  ExpectFormatError("v4", MakeNpy(F4Dict("(1,)"), FloatBytes({1}), 4), {"version 4.0"});
  ExpectFormatError("v1_1", MakeNpy(F4Dict("(1,)"), FloatBytes({1}), 1, 1), {"version 1.1"});
  ExpectFormatError("no_length", std::string("\x93NUMPY\x01\x00", 8), {"truncated header"});
  ExpectFormatError("no_length_byte2", std::string("\x93NUMPY\x01\x00\x10", 9),
                    {"truncated header"});
}

TEST(NpyErrorTest, HeaderLongerThanFile) {
  std::string bytes = MakeNpy(F4Dict("(1,)"), "");
  bytes[8] = '\xff';
  bytes[9] = '\x7f';
  ExpectFormatError("long_header", bytes, {"truncated header", "32767"});
}

TEST(NpyErrorTest, MalformedHeaderDict) {
  std::string one = FloatBytes({1});
  ExpectFormatError("not_a_dict", MakeNpy("['<f4', False, (1,)]", one),
                    {"malformed header dict", "'{'"});
  ExpectFormatError("unclosed", MakeNpy("{'descr': '<f4', 'fortran_order': False", one),
                    {"malformed header dict"});
  ExpectFormatError("missing_shape", MakeNpy("{'descr': '<f4', 'fortran_order': False}", one),
                    {"malformed header dict", "missing key 'shape'"});
  ExpectFormatError("missing_descr", MakeNpy("{'fortran_order': False, 'shape': (1,)}", one),
                    {"missing key 'descr'"});
  ExpectFormatError("extra_key",
                    MakeNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': True}",
                            one),
                    {"unexpected key 'x'"});
  ExpectFormatError(
      "duplicate_key",
      MakeNpy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", one),
      {"duplicate key 'descr'"});
  ExpectFormatError("shape_not_tuple", MakeNpy(F4Dict("(1)"), one), {"not a tuple"});
  ExpectFormatError("shape_list", MakeNpy(F4Dict("[1]"), one), {"malformed header dict"});
  ExpectFormatError("negative_dim", MakeNpy(F4Dict("(-1,)"), one), {"non-negative integer"});
  ExpectFormatError("shape_string", MakeNpy(F4Dict("'1'"), one), {"'shape' is not a tuple"});
  ExpectFormatError("descr_bool",
                    MakeNpy("{'descr': True, 'fortran_order': False, 'shape': (1,)}", one),
                    {"'descr' is not a string"});
  ExpectFormatError("fortran_string",
                    MakeNpy("{'descr': '<f4', 'fortran_order': 'no', 'shape': (1,)}", one),
                    {"'fortran_order' is not True or False"});
  ExpectFormatError("structured",
                    MakeNpy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
                            one),
                    {"structured"});
  ExpectFormatError("junk_after", MakeNpy(F4Dict("(1,)") + " x", one),
                    {"unexpected characters after the header dict"});
  ExpectFormatError("huge_dim", MakeNpy(F4Dict("(99999999999999999999,)"), one),
                    {"malformed header dict"});
  ExpectFormatError("overflow", MakeNpy(F4Dict("(4294967296, 4294967296)"), one),
                    {"too large"});
}

TEST(NpyErrorTest, WrongDtypeNamesIt) {
  ExpectFormatError("f8",
                    MakeNpy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
                            std::string(8, '\0')),
                    {"wrong dtype", "'<f8' (float64)", "'<f4'"});
  ExpectFormatError("f2",
                    MakeNpy("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }",
                            std::string(4, '\0')),
                    {"wrong dtype", "'<f2' (float16)"});
  ExpectFormatError("big_endian",
                    MakeNpy("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                            std::string(4, '\0')),
                    {"'>f4' (big-endian float32)"});
  ExpectFormatError("i4",
                    MakeNpy("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
                            std::string(4, '\0')),
                    {"'<i4' (int32)"});
  ExpectFormatError("bool",
                    MakeNpy("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }",
                            std::string(1, '\0')),
                    {"'|b1' (bool)"});
}

TEST(NpyErrorTest, FortranOrder) {
  ExpectFormatError("fortran",
                    MakeNpy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
                            FloatBytes({1, 2, 3, 4})),
                    {"fortran_order is True"});
}

TEST(NpyErrorTest, ShapeMismatch) {
  std::string bytes = MakeNpy(F4Dict("(2, 3)"), FloatBytes({1, 2, 3, 4, 5, 6}));
  ExpectFormatError("mismatch_rank", bytes, {"shape mismatch", "(2, 3)", "(*,)"}, {kAnyDim});
  ExpectFormatError("mismatch_dim", bytes, {"shape mismatch", "found (2, 3)", "expected (2, 4)"},
                    {2, 4});
  ExpectFormatError("mismatch_wild", bytes, {"expected (*, 2)"}, {kAnyDim, 2});
  std::string path = TmpPath("match.npy");
  WriteRaw(path, bytes);
  EXPECT_TRUE(ReadFloat32(path, {kAnyDim, 3}).ok());
  EXPECT_TRUE(ReadFloat32(path, {2, 3}).ok());
}

TEST(NpyErrorTest, TruncatedData) {
  ExpectFormatError("truncated", MakeNpy(F4Dict("(3,)"), FloatBytes({1, 2}).substr(0, 7)),
                    {"truncated data", "needs 12 bytes", "found 7"});
  ExpectFormatError("no_data", MakeNpy(F4Dict("(2, 2)"), ""),
                    {"truncated data", "needs 16 bytes", "found 0"});
}

TEST(NpyErrorTest, TrailingGarbage) {
  ExpectFormatError("trailing", MakeNpy(F4Dict("(2,)"), FloatBytes({1, 2}) + "xyz"),
                    {"trailing garbage", "3 bytes"});
}

TEST(NpyReaderTest, ReadsSlices) {
  std::vector<float> v(60);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  std::string path = TmpPath("slices.npy");
  ASSERT_TRUE(WriteFloat32(path, {3, 4, 5}, v.data()).ok());
  absl::StatusOr<std::unique_ptr<Float32Reader>> reader = Float32Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->shape(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ((*reader)->num_elements(), 60);
  std::vector<float> row(5);
  ASSERT_TRUE((*reader)->ReadElements(2 * 20 + 3 * 5, 5, row.data()).ok());
  EXPECT_EQ(row, (std::vector<float>{55, 56, 57, 58, 59}));
  EXPECT_EQ((*reader)->ReadElements(56, 5, row.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadElements(-1, 1, row.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE((*reader)->ReadElements(60, 0, row.data()).ok());
}

TEST(NpyWriteTest, FailureLeavesNothing) {
  float x = 1.0f;
  // No such directory: nothing is created.
  std::string missing_dir = TmpPath("no_such_dir/out.npy");
  absl::Status status = WriteFloat32(missing_dir, {1}, &x);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(missing_dir));
  EXPECT_FALSE(Exists(missing_dir));

  // The destination is a directory: rename fails, the temporary file is removed.
  std::string dir = TmpPath("write_fail");
  mkdir(dir.c_str(), 0777);
  std::string target = dir + "/target";
  mkdir(target.c_str(), 0777);
  status = WriteFloat32(target, {1}, &x);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(target));
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"target"});

  // Negative dimensions are refused before anything is written.
  status = WriteFloat32(dir + "/neg.npy", {-1}, &x);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"target"});
}

TEST(NpyWriteTest, ReplacesExistingFileAtomically) {
  std::string dir = TmpPath("replace");
  mkdir(dir.c_str(), 0777);
  std::string path = dir + "/a.npy";
  WriteRaw(path, "old contents");
  std::vector<float> v = {5, 6};
  ASSERT_TRUE(WriteFloat32(path, {2}, v.data()).ok());
  absl::StatusOr<Float32Array> a = ReadFloat32(path);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->data, v);
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"a.npy"});
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 0044, 0u) << "expected umask-derived permissions, not 0600";
}

TEST(NpyTest, ShapeToString) {
  EXPECT_EQ(ShapeToString({}), "()");
  EXPECT_EQ(ShapeToString({3}), "(3,)");
  EXPECT_EQ(ShapeToString({3, 4}), "(3, 4)");
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({3, 0}), 0);
}

}  // namespace
}  // namespace onebit::npy
