#include "common/atomic_file.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fresh, empty directory for each test.
std::string NewDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/atomic_file_", name);
  EXPECT_EQ(mkdir(dir.c_str(), 0777), 0) << dir;
  return dir;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(AtomicFileTest, WritesANewFile) {
  const std::string dir = NewDir("new");
  const std::string path = dir + "/a.json";
  ASSERT_TRUE(WriteFileAtomically(path, "{\"x\": 1}\n").ok());
  EXPECT_EQ(Read(path), "{\"x\": 1}\n");
  EXPECT_THAT(ListDir(dir), ElementsAre("a.json"));  // no temporary file left
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 0044, 0u) << "expected umask-derived permissions, not mkstemp's 0600";
}

TEST(AtomicFileTest, WritesEmptyAndBinaryContents) {
  const std::string dir = NewDir("binary");
  ASSERT_TRUE(WriteFileAtomically(dir + "/empty", "").ok());
  EXPECT_EQ(Read(dir + "/empty"), "");
  const std::string bytes("a\0b\n\xff", 5);
  ASSERT_TRUE(WriteFileAtomically(dir + "/bytes", bytes).ok());
  EXPECT_EQ(Read(dir + "/bytes"), bytes);
  EXPECT_THAT(ListDir(dir), ElementsAre("bytes", "empty"));
}

TEST(AtomicFileTest, ReplacesAnExistingFile) {
  const std::string dir = NewDir("replace");
  const std::string path = dir + "/a.txt";
  std::ofstream(path) << "a much longer old content that must not survive as a tail";
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(Read(path), "new");
  EXPECT_THAT(ListDir(dir), ElementsAre("a.txt"));
}

TEST(AtomicFileTest, PiecesAreWrittenInOrder) {
  const std::string dir = NewDir("pieces");
  const std::string big(100000, 'x');
  const absl::string_view pieces[] = {"head:", "", big, ":tail"};
  ASSERT_TRUE(WriteFileAtomically(dir + "/p", pieces).ok());
  EXPECT_EQ(Read(dir + "/p"), absl::StrCat("head:", big, ":tail"));
  EXPECT_THAT(ListDir(dir), ElementsAre("p"));
}

TEST(AtomicFileTest, AMissingDirectoryIsAnErrorAndLeavesNothing) {
  const std::string dir = NewDir("missing");
  const std::string path = dir + "/no_such_dir/a.json";
  const absl::Status status = WriteFileAtomically(path, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
  EXPECT_THAT(std::string(status.message()), HasSubstr("No such file or directory"));
  EXPECT_THAT(ListDir(dir), ElementsAre());
}

TEST(AtomicFileTest, AFailedRenameRemovesTheTemporaryFile) {
  // The destination is a non-empty directory: everything but the rename succeeds.
  const std::string dir = NewDir("rename");
  const std::string target = dir + "/target";
  ASSERT_EQ(mkdir(target.c_str(), 0777), 0);
  std::ofstream(target + "/inside") << "keep";
  const absl::Status status = WriteFileAtomically(target, "x");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(target));
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot rename"));
  EXPECT_THAT(ListDir(dir), ElementsAre("target"));
  EXPECT_EQ(Read(target + "/inside"), "keep");
}

// A reader polling the file while it is replaced again and again sees only whole
// versions: never a short file, never two versions mixed.
TEST(AtomicFileTest, AConcurrentReaderNeverSeesAPartialFile) {
  const std::string dir = NewDir("concurrent");
  const std::string path = dir + "/f";
  constexpr size_t kSize = 256 * 1024;
  ASSERT_TRUE(WriteFileAtomically(path, std::string(kSize, 'a')).ok());
  std::atomic<bool> done{false};
  std::atomic<int> reads{0};
  std::thread reader([&] {
    while (!done) {
      const std::string text = Read(path);
      ++reads;
      ASSERT_EQ(text.size(), kSize);
      ASSERT_EQ(text.find_first_not_of(text[0]), std::string::npos) << "mixed versions";
    }
  });
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(WriteFileAtomically(path, std::string(kSize, static_cast<char>('b' + i % 20))).ok());
  }
  done = true;
  reader.join();
  EXPECT_GT(reads, 0);
  EXPECT_THAT(ListDir(dir), ElementsAre("f"));
}

}  // namespace
}  // namespace onebit
