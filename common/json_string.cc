#include "common/json_string.h"

#include "absl/strings/str_format.h"

namespace onebit {

std::string JsonEscaped(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(ch));
    } else {
      out += ch;
    }
  }
  return out;
}

std::string JsonString(const std::string& s) { return "\"" + JsonEscaped(s) + "\""; }

}  // namespace onebit
