#include "common/process_memory.h"

#include <vector>

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(ProcessMemoryTest, ReadsVmHwmInBytes) {
  EXPECT_EQ(PeakRssBytesFromStatus("Name:\tx\nVmPeak:\t  9999 kB\nVmHWM:\t   123456 kB\n"
                                   "VmRSS:\t  100 kB\n"),
            123456u * 1024);
  EXPECT_EQ(PeakRssBytesFromStatus("VmHWM:\t1 kB"), 1024u);
}

TEST(ProcessMemoryTest, AbsentOrMalformedIsZero) {
  EXPECT_EQ(PeakRssBytesFromStatus(""), 0u);
  EXPECT_EQ(PeakRssBytesFromStatus("VmRSS:\t100 kB\n"), 0u);
  EXPECT_EQ(PeakRssBytesFromStatus("VmHWM:\t100 MB\n"), 0u);
  EXPECT_EQ(PeakRssBytesFromStatus("VmHWM:\tlots kB\n"), 0u);
}

TEST(ProcessMemoryTest, ThisProcessHasAPeakThatGrows) {
  const uint64_t before = PeakRssBytes();
  if (before == 0) GTEST_SKIP() << "no /proc/self/status VmHWM here";
  std::vector<char> touched(64 << 20, 1);  // 64 MiB, every page written
  EXPECT_GE(PeakRssBytes(), before);
  EXPECT_GE(PeakRssBytes(), 64u << 20);
  EXPECT_EQ(touched[12345], 1);
}

}  // namespace
}  // namespace onebit
