// JSON string literals for the JSON this project writes by hand (config echoes, the C
// interface's answers): RFC 8259's escapes for quotes, backslashes and control
// characters; every other byte is copied as it is (UTF-8 stays UTF-8).
#ifndef ONEBIT_COMMON_JSON_STRING_H_
#define ONEBIT_COMMON_JSON_STRING_H_

#include <string>

namespace onebit {

// The contents of a JSON string literal of `s`: `"` and `\` escaped with a backslash,
// control characters (< 0x20) as \uXXXX.
std::string JsonEscaped(const std::string& s);

// The literal itself: JsonEscaped(s) in double quotes.
std::string JsonString(const std::string& s);

}  // namespace onebit

#endif  // ONEBIT_COMMON_JSON_STRING_H_
