// The job config accepts every registered codec's name as exchange.compressor, and only
// those. config/ may not depend on compression/, so the schema keeps its own list; this
// keeps the two in step (a worker refuses a compressor with no codec as a config error).
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "compression/codec_registry.h"
#include "config/config_reference.h"
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

TEST(CodecNamesTest, EveryNameTheConfigAcceptsHasACodec) {
  std::string allowed;
  for (const ConfigKeyReference& key : ConfigReference()) {
    if (key.path == "onebit.exchange.compressor") allowed = key.allowed;
  }
  ASSERT_FALSE(allowed.empty());
  for (absl::string_view name : absl::StrSplit(allowed, ", ")) {  // "\"int8\", \"onebit\""
    ASSERT_TRUE(absl::ConsumePrefix(&name, "\"") && absl::ConsumeSuffix(&name, "\"")) << allowed;
    EXPECT_TRUE(FindCodec(name).ok()) << name;
  }
}

TEST(CodecNamesTest, TheConfigRejectsAnUnknownName) {
  ASSERT_FALSE(FindCodec("int4").ok());
  EXPECT_FALSE(WithCompressor("int4").ok());
}

}  // namespace
}  // namespace onebit
