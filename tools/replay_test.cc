// Unit tests of the replay library; tests/replay_test.cc runs the binary end to end.
#include "tools/replay.h"

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/npy.h"

namespace onebit::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ReplayConfig ValidConfig() {
  ReplayConfig c;
  c.workers = 2;
  c.params_path = "p.npy";
  c.grads_path = "g.npy";
  c.out_path = "o.npy";
  return c;
}

TEST(ReplayTest, NormalizeFlagNames) {
  std::vector<std::string> args = {"prog",           "--weight-decay=0.1", "--freeze-step",
                                   "5",              "--out=a-b.npy",      "-x-y",
                                   "--lr=-1",        "--",                 "--not-a-flag"};
  NormalizeFlagNames(&args);
  EXPECT_EQ(args, (std::vector<std::string>{"prog", "--weight_decay=0.1", "--freeze_step", "5",
                                            "--out=a-b.npy", "-x-y", "--lr=-1", "--",
                                            "--not-a-flag"}));
}

TEST(ReplayTest, ResolvePath) {
  EXPECT_EQ(ResolvePath("a.npy", "/w"), "/w/a.npy");
  EXPECT_EQ(ResolvePath("d/a.npy", "/w/"), "/w/d/a.npy");
  EXPECT_EQ(ResolvePath("/abs/a.npy", "/w"), "/abs/a.npy");
  EXPECT_EQ(ResolvePath("a.npy", ""), "a.npy");
  EXPECT_EQ(ResolvePath("", "/w"), "");
}

TEST(ReplayTest, ValidateConfig) {
  EXPECT_TRUE(ValidateConfig(ValidConfig()).ok());
  struct Bad {
    std::string flag;
    void (*mutate)(ReplayConfig*);
  } cases[] = {
      {"--optimizer", [](ReplayConfig* c) { c->optimizer = "adamw"; }},
      {"--transport", [](ReplayConfig* c) { c->transport = "tcp"; }},
      {"--compressor", [](ReplayConfig* c) { c->compressor = "int4"; }},
      {"--workers", [](ReplayConfig* c) { c->workers = 0; }},
      {"--workers", [](ReplayConfig* c) { c->workers = 100000; }},
      {"--lr", [](ReplayConfig* c) { c->hyper.lr = -1e-3f; }},
      {"--lr", [](ReplayConfig* c) { c->hyper.lr = INFINITY; }},
      {"--beta1", [](ReplayConfig* c) { c->hyper.beta1 = 1.0f; }},
      {"--beta1", [](ReplayConfig* c) { c->hyper.beta1 = NAN; }},
      {"--beta2", [](ReplayConfig* c) { c->hyper.beta2 = -0.5f; }},
      {"--var-freeze-step", [](ReplayConfig* c) { c->var_freeze_step = -1; }},
      {"--var-update-scaler", [](ReplayConfig* c) { c->zero_one.var_update_scaler = 0; }},
      {"--local-step-scaler", [](ReplayConfig* c) { c->zero_one.local_step_scaler = -3; }},
      {"--local-step-clipper", [](ReplayConfig* c) { c->zero_one.local_step_clipper = 0; }},
      {"--max-coeff", [](ReplayConfig* c) { c->lamb.max_coeff = NAN; }},
      {"--min-coeff", [](ReplayConfig* c) { c->lamb.max_coeff = 0.001; }},
      {"--factor-threshold", [](ReplayConfig* c) { c->lamb.factor_threshold = -1; }},
      {"--groups", [](ReplayConfig* c) { c->groups = {0, 5, 5}; }},
      {"--groups", [](ReplayConfig* c) { c->groups = {1, 5}; }},
      {"--eps", [](ReplayConfig* c) { c->hyper.eps = 0.0f; }},
      {"--weight-decay", [](ReplayConfig* c) { c->hyper.weight_decay = -0.1f; }},
      {"--freeze-step", [](ReplayConfig* c) { c->freeze_step = -1; }},
      {"--params", [](ReplayConfig* c) { c->params_path.clear(); }},
      {"--grads", [](ReplayConfig* c) { c->grads_path.clear(); }},
      {"--out", [](ReplayConfig* c) { c->out_path.clear(); }},
  };
  for (const Bad& bad : cases) {
    ReplayConfig c = ValidConfig();
    bad.mutate(&c);
    absl::Status status = ValidateConfig(c);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.flag;
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.flag + ":"));
  }
  ReplayConfig zero_lr = ValidConfig();
  zero_lr.hyper.lr = 0.0f;
  EXPECT_TRUE(ValidateConfig(zero_lr).ok()) << "lr = 0 is accepted (a no-op run)";
}

// The library entry point directly, with progress on every step.
TEST(ReplayTest, RunReplayReportsProgressAndSummary) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const int w = 3;
  const int64_t n = 50, t = 4;
  std::vector<float> params(n, 1.0f), grads(static_cast<size_t>(t * w * n));
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 7) - 0.03f;
  ReplayConfig c = ValidConfig();
  c.workers = w;
  c.freeze_step = 2;
  c.params_path = dir + "/p.npy";
  c.grads_path = dir + "/g.npy";
  c.out_path = dir + "/o.npy";
  c.progress_interval = absl::Nanoseconds(1);
  ASSERT_TRUE(npy::WriteFloat32(c.params_path, {n}, params.data()).ok());
  ASSERT_TRUE(npy::WriteFloat32(c.grads_path, {t, w, n}, grads.data()).ok());

  std::ostringstream progress;
  absl::StatusOr<ReplaySummary> s = RunReplay(c, &progress);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->n, n);
  EXPECT_EQ(s->steps, t);
  EXPECT_EQ(s->workers, w);
  EXPECT_EQ(s->warmup_steps, 2);
  EXPECT_EQ(s->compression_steps, 2);
  ASSERT_EQ(s->bytes_sent.size(), 3u);
  EXPECT_GT(s->bytes_sent[0], 0u);
  EXPECT_THAT(progress.str(), HasSubstr("step 1/4"));
  EXPECT_THAT(progress.str(), HasSubstr("step 3/4"));
  const std::string text = FormatSummary(*s);
  EXPECT_THAT(text, HasSubstr("2 warmup, 2 compression"));
  EXPECT_THAT(text, HasSubstr(c.out_path));
  absl::StatusOr<npy::Float32Array> out = npy::ReadFloat32(c.out_path, {n});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_NE(out->data, params);
}

// The 0/1 Adam line follows the kind the run had, not how --optimizer spelled it.
TEST(ReplayTest, FormatSummaryCountsZeroOneAdamsStepsOnlyForIt) {
  ReplaySummary s;
  s.optimizer = "onebit_adam";
  s.kind = OptimizerKind::kOneBitAdam;
  EXPECT_THAT(FormatSummary(s), Not(HasSubstr("0/1 Adam steps")));
  s.optimizer = "zero_one_adam";
  s.kind = OptimizerKind::kZeroOneAdam;
  s.zero_one_steps[0] = 7;
  EXPECT_THAT(FormatSummary(s), HasSubstr("0/1 Adam steps      7 variance update"));
}

}  // namespace
}  // namespace onebit::tools
