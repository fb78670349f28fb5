// The C interface's own contract (c_api.h): handles, the status codes and messages, the
// strings it allocates, and bad input refused without a crash. The embedded worker behind
// it runs whole jobs in the Python package's tests (python/tests/package_test.py).
#include "python/c_api.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

std::string Taken(char* s) {
  std::string out = s == nullptr ? "" : s;
  onebit_free(s);
  return out;
}

TEST(CApiTest, AStateKeepsWhatWasPutInOrder) {
  onebit_state* s = onebit_state_new(12, 5, 1, 2);
  ASSERT_NE(s, nullptr);
  const std::vector<float> m = {1.5f, -2.0f, 3.25f};
  ASSERT_EQ(onebit_state_put_tensor(s, 0, "exp_avg", m.data(), m.size()), 0);
  ASSERT_EQ(onebit_state_put_tensor(s, 0, "exp_avg_sq", m.data(), 2), 0);
  ASSERT_EQ(onebit_state_put_tensor(s, 1, "worker_error", m.data(), 1), 0);
  ASSERT_EQ(onebit_state_put_scalar(s, 2, "mask_fixed", 1.0), 0);
  ASSERT_EQ(onebit_state_put_scalar(s, 3, "loss_scale", 1024.0), 0);
  EXPECT_EQ(onebit_state_step(s), 12);
  EXPECT_EQ(onebit_state_freeze_step(s), 5);
  ASSERT_EQ(onebit_state_count(s, 0), 2u);
  EXPECT_STREQ(onebit_state_name(s, 0, 0), "exp_avg");
  EXPECT_STREQ(onebit_state_name(s, 0, 1), "exp_avg_sq");
  EXPECT_EQ(onebit_state_tensor_size(s, 0, 1), 2u);
  std::vector<float> out(3);
  ASSERT_EQ(onebit_state_tensor_copy(s, 0, 0, out.data()), 0);
  EXPECT_EQ(out, m);
  EXPECT_EQ(onebit_state_count(s, 1), 1u);
  EXPECT_STREQ(onebit_state_name(s, 1, 0), "worker_error");
  EXPECT_EQ(onebit_state_scalar(s, 2, 0), 1.0);
  EXPECT_EQ(onebit_state_scalar(s, 3, 0), 1024.0);
  onebit_state_free(s);
}

TEST(CApiTest, BadStateInputIsRefusedWithItsReason) {
  onebit_state* s = onebit_state_new(1, -1, -1, -1);
  const float x = 1.0f;
  ASSERT_EQ(onebit_state_put_tensor(s, 0, "exp_avg", &x, 1), 0);
  EXPECT_EQ(onebit_state_put_tensor(s, 0, "exp_avg", &x, 1), 3);  // INVALID_ARGUMENT
  EXPECT_STREQ(onebit_last_error(), "exp_avg twice");
  EXPECT_EQ(onebit_state_put_tensor(s, 2, "x", &x, 1), 3);
  EXPECT_EQ(onebit_state_put_scalar(s, 0, "x", 1.0), 3);
  EXPECT_EQ(onebit_state_put_tensor(s, 0, "y", nullptr, 4), 3);
  EXPECT_EQ(onebit_state_put_tensor(nullptr, 0, "y", &x, 1), 3);
  float out = 0;
  EXPECT_EQ(onebit_state_tensor_copy(s, 0, 7, &out), 11);  // OUT_OF_RANGE
  EXPECT_EQ(onebit_state_tensor_copy(s, 9, 0, &out), 3);
  EXPECT_STREQ(onebit_state_name(s, 0, 7), "");
  EXPECT_TRUE(std::isnan(onebit_state_scalar(s, 2, 0)));
  EXPECT_EQ(onebit_state_count(nullptr, 0), 0u);
  onebit_state_free(s);
  onebit_state_free(nullptr);
}

TEST(CApiTest, OptionsTakeTheirKeysAndRefuseOthers) {
  onebit_options* o = onebit_options_new();
  EXPECT_EQ(onebit_options_set_string(o, "config", "/x.json"), 0);
  EXPECT_EQ(onebit_options_set_int(o, "rank", 1), 0);
  EXPECT_EQ(onebit_options_set_int(o, "quiet", 1), 0);
  EXPECT_EQ(onebit_options_set_string(o, "colour", "blue"), 3);
  EXPECT_STREQ(onebit_last_error(), "no string option colour");
  EXPECT_EQ(onebit_options_set_int(o, "rank", int64_t{1} << 40), 3);
  EXPECT_EQ(onebit_options_set_string(o, "param_dtype", "bf16"), 0);
  EXPECT_EQ(onebit_options_set_string(o, "param_dtype", "fp16"), 0);
  EXPECT_EQ(onebit_options_set_string(o, "param_dtype", "float16"), 3);
  EXPECT_STREQ(onebit_last_error(), "param_dtype is fp32, bf16 or fp16, not \"float16\"");
  EXPECT_EQ(onebit_options_add_hyper_group(o, 0, 4, 1.0f, 0.0f), 0);
  EXPECT_EQ(onebit_options_add_bucket(o, 0, 4), 0);
  EXPECT_EQ(onebit_options_add_group_boundary(o, 4), 0);
  onebit_worker* w = nullptr;
  EXPECT_EQ(onebit_worker_new(o, nullptr, 4, nullptr, &w), 3);  // no parameters
  EXPECT_EQ(w, nullptr);
  onebit_options_free(o);
}

TEST(CApiTest, AWorkerHandleThatIsNullIsRefused) {
  int64_t step = 0;
  EXPECT_EQ(onebit_worker_wait_for_step(nullptr, 1.0, &step), 3);
  EXPECT_STREQ(onebit_last_error(), "the worker is null");
  EXPECT_EQ(onebit_worker_start(nullptr), 3);
  int skipped = 0;
  EXPECT_EQ(onebit_worker_skipped(nullptr, 1, &skipped), 3);
  onebit_step_inputs inputs = {};
  EXPECT_EQ(onebit_worker_supply_step(nullptr, 1, &inputs), 3);
  uintptr_t address = 0;
  int dtype = -1;
  EXPECT_EQ(onebit_worker_param_buffer(nullptr, &address, &dtype), 3);
  EXPECT_EQ(onebit_worker_gradient_buffer(nullptr, &address, &dtype), 3);
  onebit_worker_free(nullptr);
}

// A step's inputs as the ABI carries them: unknown bits and null pointers are refused by
// name before the worker sees them; well-formed inputs reach it (here: not started).
TEST(CApiTest, StepInputsAreCheckedAtTheBoundary) {
  onebit_options* o = onebit_options_new();
  ASSERT_EQ(onebit_options_set_string(o, "config", "/x.json"), 0);
  const float initial[4] = {0, 0, 0, 0};
  onebit_worker* w = nullptr;
  ASSERT_EQ(onebit_worker_new(o, initial, 4, nullptr, &w), 0) << onebit_last_error();
  onebit_options_free(o);
  EXPECT_EQ(onebit_worker_supply_step(w, 1, nullptr), 3);
  EXPECT_STREQ(onebit_last_error(), "inputs is null");
  onebit_step_inputs inputs = {};
  inputs.set = ONEBIT_STEP_LR | (1u << 9);
  EXPECT_EQ(onebit_worker_supply_step(w, 1, &inputs), 3);
  EXPECT_STREQ(onebit_last_error(),
               "onebit_step_inputs.set has unknown bits 0x200 (this library knows 0x3f)");
  inputs.set = ONEBIT_STEP_WEIGHT_DECAYS;
  inputs.n_weight_decays = 2;
  EXPECT_EQ(onebit_worker_supply_step(w, 1, &inputs), 3);
  EXPECT_STREQ(onebit_last_error(), "weight_decays is null");
  const double decays[2] = {0.0, 0.1};
  inputs.weight_decays = decays;
  inputs.set |= ONEBIT_STEP_LOSS | ONEBIT_STEP_BETAS;
  inputs.beta1 = 0.9;
  inputs.beta2 = 0.999;
  EXPECT_EQ(onebit_worker_supply_step(w, 1, &inputs), 9);  // FAILED_PRECONDITION
  EXPECT_STREQ(onebit_last_error(), "the worker is not running");
  // The gathered state likewise: null out refused by name, then not between two steps.
  onebit_state* state = nullptr;
  EXPECT_EQ(onebit_worker_gathered_state_dict(nullptr, &state), 3);
  EXPECT_EQ(onebit_worker_gathered_state_dict(w, nullptr), 3);
  EXPECT_STREQ(onebit_last_error(), "out is null");
  EXPECT_EQ(onebit_worker_gathered_state_dict(w, &state), 9);
  EXPECT_STREQ(onebit_last_error(), "the worker is not between two steps");
  EXPECT_EQ(state, nullptr);
  onebit_worker_free(w);
}

TEST(CApiTest, ConfigsAreCheckedAndTheirFactsAreJson) {
  char* json = nullptr;
  ASSERT_EQ(onebit_strict_json("{\"steps\": 7, // seven\n}", &json), 0);
  EXPECT_EQ(Taken(json).find("//"), std::string::npos);
  char* facts = nullptr;
  ASSERT_EQ(onebit_config_facts("{\"gradient_accumulation_steps\": 4}", &facts), 0);
  const std::string f = Taken(facts);
  EXPECT_NE(f.find("\"micro_batches\": 4"), std::string::npos) << f;
  EXPECT_NE(f.find("\"scales_loss\": false"), std::string::npos) << f;
  EXPECT_EQ(onebit_config_facts("{\"steps\": \"x\"}", &facts), 3);
  EXPECT_NE(std::string(onebit_last_error()).find("steps"), std::string::npos);
  char* notices = nullptr;
  EXPECT_EQ(onebit_check_config("/nonexistent/job.json", &notices), 5);  // NOT_FOUND
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/job.json";
  std::ofstream(path) << "{\"onebit\": {\"checkpoint\": {\"dir\": \"/c\"}}}";
  ASSERT_EQ(onebit_check_config(path.c_str(), &notices), 0);
  EXPECT_NE(Taken(notices).find("a checkpoint every 1000 steps"), std::string::npos);
  EXPECT_EQ(onebit_abi_version(), ONEBIT_ABI_VERSION);
  EXPECT_GT(onebit_default_max_restarts(), 0);
  EXPECT_GT(onebit_max_mask_ranges(), 0);
}

TEST(CApiTest, ErrorsAreEachThreadsOwn) {
  EXPECT_EQ(onebit_options_set_string(nullptr, "config", "x"), 3);
  const std::string mine = onebit_last_error();
  std::string theirs;
  std::thread other([&] { theirs = onebit_last_error(); });
  other.join();
  EXPECT_EQ(mine, "an argument is null");
  EXPECT_EQ(theirs, "");
}

}  // namespace
