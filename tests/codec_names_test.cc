// The job config accepts every registered codec's name as exchange.compressor. config/ may
// not depend on compression/, so the schema keeps its own list; this keeps the two in step.
#include <string>

#include "compression/codec_registry.h"
#include "config/job_config.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

absl::StatusOr<JobConfig> WithCompressor(const std::string& name) {
  return ParseJobConfig(R"({"onebit": {"exchange": {"compressor": ")" + name + R"("}}})");
}

TEST(CodecNamesTest, TheConfigAcceptsEveryCodec) {
  for (const Codec* codec : AllCodecs()) {
    const std::string name(codec->name());
    absl::StatusOr<JobConfig> config = WithCompressor(name);
    ASSERT_TRUE(config.ok()) << name << ": " << config.status();
    EXPECT_EQ(config->exchange.compressor, name);
    EXPECT_TRUE(FindCodec(config->exchange.compressor).ok()) << name;
  }
}

TEST(CodecNamesTest, TheConfigRejectsAnUnknownName) {
  ASSERT_FALSE(FindCodec("int4").ok());
  EXPECT_FALSE(WithCompressor("int4").ok());
}

}  // namespace
}  // namespace onebit
