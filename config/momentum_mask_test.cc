#include "config/momentum_mask.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/npy.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// A .npy v1.0 file written byte by byte (numpy's layout: magic, version, little-endian
// header length, the dict padded with spaces to a multiple of 64 ending in '\n', the data).
void WriteRawNpy(const std::string& path, const std::string& descr, const std::string& shape,
                 const std::string& data) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t unpadded = 10 + dict.size() + 1;
  dict += std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict + data;
  std::ofstream(path, std::ios::binary) << out;
}

MomentumMaskConfig FromNpy(const std::string& path) {
  MomentumMaskConfig c;
  c.npy = path;
  return c;
}

void ExpectError(const absl::StatusOr<std::vector<float>>& got, absl::StatusCode code,
                 const std::vector<std::string>& parts) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), code) << got.status();
  for (const std::string& part : parts) {
    EXPECT_NE(std::string(got.status().message()).find(part), std::string::npos)
        << "missing '" << part << "' in: " << got.status().message();
  }
}

TEST(MomentumMaskTest, NoneIsAllOnes) {
  MomentumMaskConfig c;
  EXPECT_FALSE(HasMomentumMask(c));
  c.auto_zero_grad = true;
  EXPECT_FALSE(HasMomentumMask(c));
  auto mask = BuildMomentumMask(c, 5);
  ASSERT_TRUE(mask.ok());
  EXPECT_EQ(*mask, std::vector<float>(5, 1.0f));
  EXPECT_TRUE(BuildMomentumMask(c, 0)->empty());
}

TEST(MomentumMaskTest, RangesAreMaskedAnyOrderOverlapsFine) {
  MomentumMaskConfig c;
  c.ranges = {{7, 10}, {0, 2}, {8, 9}, {1, 3}};
  EXPECT_TRUE(HasMomentumMask(c));
  auto mask = BuildMomentumMask(c, 11);
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_EQ(*mask, (std::vector<float>{0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1}));
  // A range up to n exactly is fine; one past it names the range.
  c.ranges = {{0, 1}, {9, 11}};
  EXPECT_TRUE(BuildMomentumMask(c, 11).ok());
  ExpectError(BuildMomentumMask(c, 10), absl::StatusCode::kInvalidArgument,
              {"onebit.momentum_mask.ranges[1]: [9, 11)", "10 parameters"});
  c.ranges = {{3, 3}};  // built by hand: the parser refuses it already
  ExpectError(BuildMomentumMask(c, 10), absl::StatusCode::kInvalidArgument,
              {"onebit.momentum_mask.ranges[0]"});
}

TEST(MomentumMaskTest, ThroughTheParser) {
  auto config = ParseJobConfig(R"({"onebit": {"momentum_mask": {"ranges": [[2, 4]]}}})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto mask = BuildMomentumMask(config->momentum_mask, 5);
  ASSERT_TRUE(mask.ok());
  EXPECT_EQ(*mask, (std::vector<float>{1, 1, 0, 0, 1}));
}

TEST(MomentumMaskTest, Float32FileFromTheNpyWriter) {
  const std::string path = TempPath("mask_f32.npy");
  const std::vector<float> want = {1, 0, 0, 1, 1, 0, 1};  // 7: not a multiple of 8
  ASSERT_TRUE(npy::WriteFloat32(path, {7}, want.data()).ok());
  auto mask = BuildMomentumMask(FromNpy(path), 7);
  ASSERT_TRUE(mask.ok()) << mask.status();
  EXPECT_EQ(*mask, want);
  // The wrong length names both.
  ExpectError(BuildMomentumMask(FromNpy(path), 8), absl::StatusCode::kInvalidArgument,
              {"onebit.momentum_mask.npy: ", path, "shape (7,), expected (8,)"});
  // 2-D is refused even with n elements.
  const std::string square = TempPath("mask_2d.npy");
  const std::vector<float> four = {1, 1, 0, 1};
  ASSERT_TRUE(npy::WriteFloat32(square, {2, 2}, four.data()).ok());
  ExpectError(BuildMomentumMask(FromNpy(square), 4), absl::StatusCode::kInvalidArgument,
              {"shape (2, 2), expected (4,)"});
}

TEST(MomentumMaskTest, ValuesMustBeZeroOrOne) {
  const std::string path = TempPath("mask_half.npy");
  const std::vector<float> half = {1, 0.5f, 0};
  ASSERT_TRUE(npy::WriteFloat32(path, {3}, half.data()).ok());
  ExpectError(BuildMomentumMask(FromNpy(path), 3), absl::StatusCode::kInvalidArgument,
              {"element 1 is 0.5", "0 (masked) and 1"});
  const std::vector<float> nan = {1, 1, std::numeric_limits<float>::quiet_NaN()};
  ASSERT_TRUE(npy::WriteFloat32(path, {3}, nan.data()).ok());
  ExpectError(BuildMomentumMask(FromNpy(path), 3), absl::StatusCode::kInvalidArgument,
              {"element 2 is nan"});
  const std::string bytes = TempPath("mask_u8_two.npy");
  WriteRawNpy(bytes, "|u1", "(3,)", std::string("\x01\x02\x00", 3));
  ExpectError(BuildMomentumMask(FromNpy(bytes), 3), absl::StatusCode::kInvalidArgument,
              {"element 1 is 2"});
}

TEST(MomentumMaskTest, BoolAndUint8Files) {
  for (const char* descr : {"|b1", "|u1"}) {
    const std::string path = TempPath(std::string("mask_") + (descr[1] == 'b' ? "b1" : "u1") + ".npy");
    WriteRawNpy(path, descr, "(9,)", std::string("\x01\x01\x00\x01\x00\x00\x01\x01\x01", 9));
    auto mask = BuildMomentumMask(FromNpy(path), 9);
    ASSERT_TRUE(mask.ok()) << descr << ": " << mask.status();
    EXPECT_EQ(*mask, (std::vector<float>{1, 1, 0, 1, 0, 0, 1, 1, 1})) << descr;
    std::string got_descr;
    auto raw = npy::ReadAsFloat32(path, &got_descr);
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(got_descr, descr);
  }
}

TEST(MomentumMaskTest, SummaryTellsMasksApartWhateverTheirFile) {
  const std::vector<float> mask = {1, 1, 0, 1, 0, 0, 1, 1, 1};
  EXPECT_EQ(MomentumMaskSummary(mask).rfind("3 of 9 masked, digest ", 0), 0u)
      << MomentumMaskSummary(mask);
  // The same zeros read from a bool file summarise alike.
  const std::string path = TempPath("mask_summary.npy");
  WriteRawNpy(path, "|b1", "(9,)", std::string("\x01\x01\x00\x01\x00\x00\x01\x01\x01", 9));
  absl::StatusOr<std::vector<float>> from_file = BuildMomentumMask(FromNpy(path), 9);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(MomentumMaskSummary(*from_file), MomentumMaskSummary(mask));
  // As many zeros elsewhere, a run moved by one, one more element: each its own.
  const std::vector<std::vector<float>> others = {{1, 0, 1, 1, 0, 0, 1, 1, 1},
                                                  {1, 1, 0, 1, 1, 0, 0, 1, 1},
                                                  {1, 1, 0, 1, 0, 0, 1, 1, 1, 1},
                                                  {0, 0, 0, 1, 1, 1, 1, 1, 1}};
  for (const std::vector<float>& other : others) {
    EXPECT_NE(MomentumMaskSummary(other), MomentumMaskSummary(mask));
  }
  EXPECT_EQ(MomentumMaskSummary(std::vector<float>(4, 1.0f)).rfind("0 of 4 masked", 0), 0u);
}

TEST(MomentumMaskTest, CorruptFiles) {
  // Truncated: the float32 writer's file with its last bytes cut off.
  const std::string path = TempPath("mask_cut.npy");
  const std::vector<float> ones(16, 1.0f);
  ASSERT_TRUE(npy::WriteFloat32(path, {16}, ones.data()).ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  ExpectError(BuildMomentumMask(FromNpy(path), 16), absl::StatusCode::kInvalidArgument,
              {"onebit.momentum_mask.npy: ", path, "truncated data"});
  // A bool file one byte short.
  const std::string short_bool = TempPath("mask_short_bool.npy");
  WriteRawNpy(short_bool, "|b1", "(4,)", std::string("\x01\x01\x01", 3));
  ExpectError(BuildMomentumMask(FromNpy(short_bool), 4), absl::StatusCode::kInvalidArgument,
              {"truncated data: shape (4,) |b1 needs 4 bytes"});
  // Truncated inside the header.
  std::filesystem::resize_file(path, 20);
  ExpectError(BuildMomentumMask(FromNpy(path), 16), absl::StatusCode::kInvalidArgument,
              {"truncated header"});
  // Wrong dtypes.
  const std::string f64 = TempPath("mask_f64.npy");
  WriteRawNpy(f64, "<f8", "(2,)", std::string(16, '\0'));
  ExpectError(BuildMomentumMask(FromNpy(f64), 2), absl::StatusCode::kInvalidArgument,
              {"wrong dtype: found '<f8' (float64)", "'|b1' (bool)"});
  const std::string i32 = TempPath("mask_i4.npy");
  WriteRawNpy(i32, "<i4", "(2,)", std::string(8, '\0'));
  ExpectError(BuildMomentumMask(FromNpy(i32), 2), absl::StatusCode::kInvalidArgument,
              {"wrong dtype: found '<i4' (int32)"});
  // Not a .npy at all, and no file.
  const std::string text = TempPath("mask.txt");
  std::ofstream(text) << "1 0 1\n";
  ExpectError(BuildMomentumMask(FromNpy(text), 3), absl::StatusCode::kInvalidArgument,
              {"bad magic"});
  ExpectError(BuildMomentumMask(FromNpy(TempPath("missing.npy")), 3),
              absl::StatusCode::kNotFound, {"onebit.momentum_mask.npy: ", "missing.npy"});
}

}  // namespace
}  // namespace onebit
