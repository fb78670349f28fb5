// How long a checkpoint part of a given size takes to encode (with its CRC-32) and to
// write durably, against writing the same bytes with a plain write + fsync.
//
//   bazel run -c opt //checkpoint:part_benchmark -- [MEGABYTES=60] [DIR=/tmp]
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "checkpoint/part.h"
#include "common/atomic_file.h"

int main(int argc, char** argv) {
  const double mb = argc > 1 ? std::atof(argv[1]) : 60;
  const std::string dir = argc > 2 ? argv[2] : "/tmp";
  const size_t floats = static_cast<size_t>(mb * 1e6 / 4);
  onebit::checkpoint::Part part;
  std::vector<float> data(floats);
  for (size_t i = 0; i < floats; ++i) data[i] = static_cast<float>(i % 1000) * 0.001f;
  part.Put("params", std::move(data));
  auto ms = [](absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); };
  for (int round = 0; round < 3; ++round) {
    absl::Time t = absl::Now();
    const std::string bytes = onebit::checkpoint::EncodePart(part);
    const double encode = ms(t);
    t = absl::Now();
    const uint32_t crc = onebit::checkpoint::Crc32(bytes);
    const double crc_ms = ms(t);
    t = absl::Now();
    const std::string path = dir + "/part_benchmark.part";
    if (!onebit::WriteFileAtomically(path, bytes).ok()) return 1;
    const double atomic = ms(t);
    t = absl::Now();
    const int fd = open((dir + "/part_benchmark.raw").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
      if (n <= 0) return 1;
      done += static_cast<size_t>(n);
    }
    fsync(fd);
    close(fd);
    const double raw = ms(t);
    t = absl::Now();
    if (!onebit::checkpoint::WritePart(path, part).ok()) return 1;
    const double write_part = ms(t);
    std::printf("%.1f MB: WritePart %.1f ms; plain write+fsync %.1f ms; (encode to one string %.1f ms, "
                "CRC-32 %.1f ms (%u), atomic write of that string %.1f ms)\n",
                bytes.size() / 1e6, write_part, raw, encode, crc_ms, crc, atomic);
    unlink(path.c_str());
    unlink((dir + "/part_benchmark.raw").c_str());
  }
  return 0;
}
