// The IDX reader on the real Debian files and on broken ones written to TEST_TMPDIR, the
// loader's errors, and the batch sampler's guarantees.
#include "worker/workloads/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// A fresh directory under TEST_TMPDIR for one test.
std::string MakeDir(const std::string& name) {
  const std::string dir = absl::StrCat(TempDir(), "/", name);
  std::string cmd = absl::StrCat("rm -rf '", dir, "' && mkdir -p '", dir, "'");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

std::vector<uint8_t> IdxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                              uint8_t type = 0x08) {
  std::vector<uint8_t> bytes = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back((d >> shift) & 0xff);
  }
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  ASSERT_TRUE(out.good()) << path;
}

std::vector<uint8_t> Gzip(const std::vector<uint8_t>& bytes) {
  const std::string path = TempDir() + "/gzip_scratch.gz";
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  EXPECT_EQ(gzwrite(f, bytes.data(), bytes.size()), static_cast<int>(bytes.size()));
  gzclose(f);
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::vector<uint8_t> Ramp(size_t n) {
  std::vector<uint8_t> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<uint8_t>(i * 7);
  return data;
}

// Bytes that do not compress, so that a gzip stream is long and its middle is data.
std::vector<uint8_t> Noise(size_t n) {
  std::vector<uint8_t> data(n);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    data[i] = static_cast<uint8_t>(x >> 24);
  }
  return data;
}

TEST(ReadIdxFileTest, PlainAndGzipGiveTheSameArray) {
  const std::string dir = MakeDir("plain_and_gzip");
  const std::vector<uint8_t> data = Ramp(2 * 3 * 5);
  const std::vector<uint8_t> bytes = IdxBytes({2, 3, 5}, data);
  WriteFile(dir + "/a", bytes);
  WriteFile(dir + "/a.gz", Gzip(bytes));
  for (const char* name : {"a", "a.gz"}) {
    auto array = ReadIdxFile(dir + "/" + name);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_EQ(array->dims, (std::vector<int64_t>{2, 3, 5}));
    EXPECT_EQ(array->data, data);
  }
}

TEST(ReadIdxFileTest, EmptyDimensionIsFine) {
  const std::string dir = MakeDir("empty_dim");
  WriteFile(dir + "/a", IdxBytes({0}, {}));
  auto array = ReadIdxFile(dir + "/a");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_TRUE(array->data.empty());
}

struct BadFile {
  std::string name;
  std::vector<uint8_t> bytes;
  absl::StatusCode code;
  std::string message;
};

TEST(ReadIdxFileTest, BrokenFilesGiveClearErrors) {
  const std::string dir = MakeDir("broken");
  const std::vector<uint8_t> good = IdxBytes({4, 8}, Ramp(32));
  std::vector<uint8_t> gz = Gzip(IdxBytes({100, 100}, Noise(10000)));
  ASSERT_GT(gz.size(), 5000u);
  std::vector<uint8_t> gz_truncated(gz.begin(), gz.begin() + gz.size() / 2);
  // Damage in the middle of the stream: caught by the decoder or the CRC at the end.
  std::vector<uint8_t> gz_corrupt = gz;
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 20; ++i) gz_corrupt[i] ^= 0x5a;
  std::vector<uint8_t> with_trailing = good;
  with_trailing.push_back(1);

  const std::vector<BadFile> cases = {
      {"empty", {}, absl::StatusCode::kInvalidArgument, "not an IDX file"},
      {"text", {'h', 'e', 'l', 'l', 'o'}, absl::StatusCode::kInvalidArgument, "not an IDX file"},
      {"float_type", IdxBytes({1}, {0, 0, 0, 0}, 0x0d), absl::StatusCode::kInvalidArgument,
       "not unsigned byte"},
      {"zero_dims", {0, 0, 8, 0}, absl::StatusCode::kInvalidArgument, "0 dimensions"},
      {"short_header",
       {0, 0, 8, 3, 0, 0, 0, 1},
       absl::StatusCode::kDataLoss,
       "truncated IDX header"},
      {"truncated", std::vector<uint8_t>(good.begin(), good.end() - 5), absl::StatusCode::kDataLoss,
       "truncated: the header promises 32 bytes"},
      {"trailing", with_trailing, absl::StatusCode::kDataLoss, "trailing bytes"},
      {"huge", IdxBytes({60000, 60000, 60000}, {}), absl::StatusCode::kInvalidArgument,
       "exceed the limit"},
      {"gz_truncated.gz", gz_truncated, absl::StatusCode::kDataLoss, ""},
      {"gz_corrupt.gz", gz_corrupt, absl::StatusCode::kDataLoss, ""},
  };
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir + "/" + c.name;
    WriteFile(path, c.bytes);
    auto array = ReadIdxFile(path);
    ASSERT_FALSE(array.ok());
    EXPECT_EQ(array.status().code(), c.code) << array.status();
    EXPECT_THAT(array.status().message(), HasSubstr(path));
    EXPECT_THAT(array.status().message(), HasSubstr(c.message));
  }
}

TEST(ReadIdxFileTest, MissingFileIsNotFound) {
  auto array = ReadIdxFile(TempDir() + "/no/such/file");
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound) << array.status();
}

TEST(LoadFashionMnistTest, MissingDataSaysWhichPackageToInstall) {
  const std::string dir = MakeDir("no_data");
  auto data = LoadFashionMnist(dir);
  ASSERT_EQ(data.status().code(), absl::StatusCode::kNotFound) << data.status();
  EXPECT_THAT(data.status().message(),
              HasSubstr(absl::StrCat("Fashion-MNIST not found in ", dir,
                                     ": install Debian's dataset-fashion-mnist (apt-get install "
                                     "dataset-fashion-mnist)")));
  EXPECT_THAT(data.status().message(), HasSubstr("t10k-labels-idx1-ubyte[.gz]"));
}

// A tiny data set in Fashion-MNIST's format: `train` and `test` images of 28x28.
void WriteTinyDataSet(const std::string& dir, uint32_t train, uint32_t test, uint32_t train_labels,
                      uint8_t label_value) {
  WriteFile(dir + "/train-images-idx3-ubyte", IdxBytes({train, 28, 28}, Ramp(train * 784)));
  WriteFile(dir + "/train-labels-idx1-ubyte",
            IdxBytes({train_labels}, std::vector<uint8_t>(train_labels, label_value)));
  // The test split gzipped: both forms may be mixed.
  WriteFile(dir + "/t10k-images-idx3-ubyte.gz", Gzip(IdxBytes({test, 28, 28}, Ramp(test * 784))));
  WriteFile(dir + "/t10k-labels-idx1-ubyte.gz",
            Gzip(IdxBytes({test}, std::vector<uint8_t>(test, 3))));
}

TEST(LoadFashionMnistTest, TinyDataSet) {
  const std::string dir = MakeDir("tiny");
  WriteTinyDataSet(dir, 5, 2, 5, 9);
  auto data = LoadFashionMnist(dir);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->train.count, 5);
  EXPECT_EQ((*data)->test.count, 2);
  EXPECT_EQ((*data)->train.labels, std::vector<uint8_t>(5, 9));
  const int64_t index = 1;
  std::vector<float> x(784);
  (*data)->train.Gather(&index, 1, x.data());
  for (int k = 0; k < 784; ++k) {
    EXPECT_EQ(x[k], static_cast<float>(static_cast<uint8_t>((784 + k) * 7)) / 255.0f);
  }
}

TEST(LoadFashionMnistTest, InconsistentFilesAreRejected) {
  {
    const std::string dir = MakeDir("count_mismatch");
    WriteTinyDataSet(dir, 5, 2, 4, 0);
    auto data = LoadFashionMnist(dir);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
    EXPECT_THAT(data.status().message(), HasSubstr("4 labels for 5 images"));
  }
  {
    const std::string dir = MakeDir("bad_label");
    WriteTinyDataSet(dir, 5, 2, 5, 10);
    auto data = LoadFashionMnist(dir);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
    EXPECT_THAT(data.status().message(), HasSubstr("label 0 is 10"));
  }
  {
    const std::string dir = MakeDir("bad_shape");
    WriteTinyDataSet(dir, 5, 2, 5, 0);
    WriteFile(dir + "/train-images-idx3-ubyte", IdxBytes({5, 28, 27}, Ramp(5 * 28 * 27)));
    auto data = LoadFashionMnist(dir);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << data.status();
    EXPECT_THAT(data.status().message(), HasSubstr("(N, 28, 28)"));
  }
}

TEST(LoadFashionMnistTest, RealDebianFiles) {
  auto data = LoadFashionMnist(kDefaultFashionMnistDir);
  ASSERT_TRUE(data.ok()) << data.status();
  const FashionMnist& d = **data;
  EXPECT_EQ(d.train.count, 60000);
  EXPECT_EQ(d.test.count, 10000);
  EXPECT_EQ(d.train.rows, 28);
  EXPECT_EQ(d.train.cols, 28);
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::vector<int> train_per_class(kFashionMnistClasses), test_per_class(kFashionMnistClasses);
  for (uint8_t label : d.train.labels) ++train_per_class[label];
  for (uint8_t label : d.test.labels) ++test_per_class[label];
  EXPECT_EQ(train_per_class, std::vector<int>(kFashionMnistClasses, 6000));
  EXPECT_EQ(test_per_class, std::vector<int>(kFashionMnistClasses, 1000));
  // Normalised pixels span [0, 1].
  std::vector<int64_t> indices(100);
  for (int64_t i = 0; i < 100; ++i) indices[i] = i * 600;
  std::vector<float> x(100 * 784);
  d.train.Gather(indices.data(), 100, x.data());
  EXPECT_EQ(*std::min_element(x.begin(), x.end()), 0.0f);
  EXPECT_EQ(*std::max_element(x.begin(), x.end()), 1.0f);
}

TEST(BatchSamplerTest, EveryEpochIsAPermutation) {
  for (int64_t n : {1, 2, 7, 64, 1000, 60000}) {
    BatchSampler sampler(n, 42, 0, 1, 1);
    for (uint64_t epoch : {0, 1, 17}) {
      std::vector<bool> seen(n);
      for (int64_t pos = 0; pos < n; ++pos) {
        const int64_t x = sampler.Permute(epoch, pos);
        ASSERT_GE(x, 0);
        ASSERT_LT(x, n);
        ASSERT_FALSE(seen[x]) << "n=" << n << " epoch=" << epoch << " pos=" << pos;
        seen[x] = true;
      }
    }
  }
}

TEST(BatchSamplerTest, RanksShareNothingAndAnEpochVisitsEachExampleOnce) {
  // 3 ranks x 4 examples x 5 steps = 60 = one epoch.
  constexpr int64_t kExamples = 60;
  constexpr int kWorld = 3;
  constexpr int64_t kBatch = 4;
  std::multiset<int64_t> visited;
  for (int64_t step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < kWorld; ++rank) {
      BatchSampler sampler(kExamples, 9, rank, kWorld, kBatch);
      std::vector<int64_t> indices(kBatch);
      sampler.Indices(step, indices.data());
      visited.insert(indices.begin(), indices.end());
    }
  }
  for (int64_t i = 0; i < kExamples; ++i) EXPECT_EQ(visited.count(i), 1u) << i;
}

TEST(BatchSamplerTest, DeterministicInSeedStepAndRank) {
  auto indices = [](uint64_t seed, int64_t step, int rank) {
    BatchSampler sampler(60000, seed, rank, 2, 16);
    std::vector<int64_t> out(16);
    sampler.Indices(step, out.data());
    return out;
  };
  EXPECT_EQ(indices(1, 5, 1), indices(1, 5, 1));
  EXPECT_NE(indices(1, 5, 1), indices(2, 5, 1));
  EXPECT_NE(indices(1, 5, 1), indices(1, 6, 1));
  EXPECT_NE(indices(1, 5, 1), indices(1, 5, 0));
}

}  // namespace
}  // namespace onebit
