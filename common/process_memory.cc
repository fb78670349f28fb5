#include "common/process_memory.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace onebit {

uint64_t PeakRssBytesFromStatus(absl::string_view status) {
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmHWM:")) continue;
    line = absl::StripAsciiWhitespace(line);
    if (!absl::ConsumeSuffix(&line, "kB")) return 0;
    uint64_t kib = 0;
    return absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &kib) ? kib * 1024 : 0;
  }
  return 0;
}

uint64_t PeakRssBytes() {
  std::ifstream file("/proc/self/status");
  if (!file) return 0;
  std::stringstream text;
  text << file.rdbuf();
  return PeakRssBytesFromStatus(text.str());
}

}  // namespace onebit
