#include "common/json_string.h"

#include <string>

#include "gtest/gtest.h"

namespace onebit {
namespace {

TEST(JsonStringTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonString(""), "\"\"");
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonEscaped("a \"b\" c\\d"), "a \\\"b\\\" c\\\\d");
  EXPECT_EQ(JsonEscaped(std::string("x\ny\tz\x01", 6)), "x\\u000ay\\u0009z\\u0001");
  EXPECT_EQ(JsonEscaped(std::string("\0", 1)), "\\u0000");
  EXPECT_EQ(JsonEscaped("\x7f"), "\x7f");                  // DEL is no control character here
  EXPECT_EQ(JsonEscaped("gr\xc3\xbc\xc3\x9f"), "gr\xc3\xbc\xc3\x9f");  // UTF-8 as it is
}

}  // namespace
}  // namespace onebit
