// JobConfigToJson's bytes feed the job's CRC (coordinator/job_coordinator.cc), the
// launcher's override check and the fuzzer's round trip: they must not change by accident.
// This test prints every seed config and one config per optimizer type and compares the
// text with config/testdata/job_config_json.golden.
//
// After an intended change, rewrite the golden file:
//   ONEBIT_GOLDEN_OUT=$PWD/config/testdata/job_config_json.golden \
//       bazel run //config:job_config_json_golden_test
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "config/job_config.h"
#include "config/seed_configs_test.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using namespace seed_configs;  // NOLINT: the kSeed constants

const std::vector<std::pair<std::string, std::string>>& Configs() {
  static const auto* configs = new std::vector<std::pair<std::string, std::string>>{
      {"seed000_1", kSeed000_1},   {"seed000_2", kSeed000_2},   {"seed003_1", kSeed003_1},
      {"seed003_2", kSeed003_2},   {"seed003_3", kSeed003_3},   {"seed003_4", kSeed003_4},
      {"seed003_5", kSeed003_5},   {"seed003_6", kSeed003_6},   {"seed003_7", kSeed003_7},
      {"seed003_8", kSeed003_8},   {"seed003_9", kSeed003_9},   {"seed003_10", kSeed003_10},
      {"seed003_11", kSeed003_11}, {"seed003_12", kSeed003_12}, {"seed003_13", kSeed003_13},
      {"seed003_14", kSeed003_14}, {"seed003_15", kSeed003_15},
      {"defaults", "{}"},
      {"zero_one_adam", R"({"optimizer": {"type": "zerooneadam", "params": {"lr": 1e-3,
          "var_freeze_step": 40, "var_update_scaler": 4, "local_step_scaler": 8,
          "local_step_clipper": 4, "update_clip": 1.5}}})"},
      {"adamw", R"({"optimizer": {"type": "AdamW", "params": {"lr": 3e-4,
          "weight_decay": 0.01, "bias_correction": true}}})"},
      {"onebit_lamb", R"({"optimizer": {"type": "OneBitLamb", "params": {"freeze_step": 7,
          "max_coeff": 0.3, "min_coeff": 0.01, "factor_threshold": 0.2}}})"},
      {"onebit_adam_ps", R"({"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 3}},
          "onebit": {"workers": 4, "exchange": {"mode": "ps", "servers": 2,
          "warmup_over": "workers"}}})"},
  };
  return *configs;
}

// Each config's JobConfigToJson, or its parse error.
std::string PrintAll() {
  std::string out;
  for (const auto& [name, json] : Configs()) {
    absl::StatusOr<JobConfig> c = ParseJobConfig(json);
    absl::StrAppend(&out, "== ", name, "\n",
                    c.ok() ? JobConfigToJson(*c) : absl::StrCat("error: ", c.status().message()),
                    "\n");
  }
  return out;
}

TEST(JobConfigJsonGoldenTest, BytesUnchanged) {
  const std::string actual = PrintAll();
  if (const char* out = std::getenv("ONEBIT_GOLDEN_OUT")) {
    std::ofstream(out) << actual;
    GTEST_SKIP() << "wrote " << out;
  }
  std::ifstream in("config/testdata/job_config_json.golden");
  ASSERT_TRUE(in.good()) << "config/testdata/job_config_json.golden is missing";
  std::stringstream golden;
  golden << in.rdbuf();
  EXPECT_EQ(actual, golden.str());
}

}  // namespace
}  // namespace onebit
