// ExternalWorkload between a real Trainer (its own thread) and a client thread that plays
// the training script: the client sees the optimizer's own parameter buffer, writes its
// gradient, and either side's end reaches the other.
#include "worker/workloads/external_workload.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/trainer.h"
#include "worker/transport/inproc_transport.h"

namespace onebit {
namespace {

constexpr size_t kN = 5;

// n initial parameters of `value`, shared as ExternalWorkloadOptions takes them.
std::shared_ptr<const std::vector<float>> Initial(size_t n, float value) {
  return std::make_shared<const std::vector<float>>(n, value);
}

// What a script that sets nothing but its loss (none: nullopt) hands in.
StepInputs WithLoss(std::optional<double> loss) {
  StepInputs in;
  in.loss = loss;
  return in;
}
constexpr float kTarget = 3.0f;

struct Rig {
  std::unique_ptr<kernels::Backend> backend = kernels::NewCpuBackend();
  std::shared_ptr<InprocHub> hub = *InprocHub::Create(1);
  std::unique_ptr<Transport> transport = *hub->Connect(0);
  std::unique_ptr<ExternalWorkload> workload;
  std::unique_ptr<StaticStepController> controller;
  std::unique_ptr<Trainer> trainer;

  explicit Rig(int64_t steps, std::optional<LossScalerOptions> loss_scaling = std::nullopt,
               std::vector<std::string>* lines = nullptr) {
    ExternalWorkloadOptions o;
    o.initial = Initial(kN, 0.0f);
    o.groups = {0, 2, kN};
    auto made = ExternalWorkload::Create(o, backend.get());
    EXPECT_TRUE(made.ok()) << made.status();
    workload = std::move(*made);
    controller = std::make_unique<StaticStepController>(/*freeze_step=*/steps / 2, steps);
    TrainerOptions options;
    options.optimizer.hyper.lr = 0.05f;
    options.print = [lines](absl::string_view line) {
      if (lines != nullptr) lines->emplace_back(line);
    };
    options.log_every = 2;
    options.eval_at_end = false;
    options.loss_scaling = loss_scaling;
    auto t = Trainer::Create(options, workload.get(), backend.get(), transport.get(),
                             controller.get());
    EXPECT_TRUE(t.ok()) << t.status();
    trainer = std::move(*t);
  }

  // The trainer's thread: runs the job, tells the client its end, leaves the status in
  // *trained.
  std::thread Train(absl::Status* trained) {
    return std::thread([this, trained] {
      absl::StatusOr<TrainerSummary> s = trainer->Run();
      *trained = s.status();
      workload->Finish(s.status());
    });
  }
};

// A script that hands no loss (Supply without one) gets none in the progress line and in
// the summary, not a 0; where it hands one for some steps of a line, their mean.
TEST(ExternalWorkloadTest, AStepWithoutALossLeavesTheLossOut) {
  constexpr int64_t kSteps = 6;
  std::vector<std::string> lines;
  Rig rig(kSteps, std::nullopt, &lines);
  absl::Status trained;
  std::thread trainer = rig.Train(&trained);
  for (;;) {
    absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
    ASSERT_TRUE(step.ok()) << step.status();
    if (*step < 0) break;
    float* g = rig.workload->gradient();
    for (size_t i = 0; i < kN; ++i) g[i] = 1.0f;
    // Steps 1-2: no loss; 3: 0.25 and 4: none; 5: 0.5 and 6: 0.75.
    const std::optional<double> loss = *step == 3   ? std::optional<double>(0.25)
                                       : *step == 5 ? std::optional<double>(0.5)
                                       : *step == 6 ? std::optional<double>(0.75)
                                                    : std::nullopt;
    ASSERT_TRUE(rig.workload->Supply(*step, WithLoss(loss)).ok());
    EXPECT_EQ(rig.workload->loss_given(), loss.has_value());
  }
  trainer.join();
  ASSERT_TRUE(trained.ok()) << trained;
  std::vector<std::string> progress;
  for (const std::string& line : lines) {
    if (line.rfind("step ", 0) == 0) progress.push_back(line);
  }
  ASSERT_EQ(progress.size(), 3u) << ::testing::PrintToString(lines);
  EXPECT_EQ(progress[0].find("loss"), std::string::npos) << progress[0];
  EXPECT_NE(progress[1].find("  loss 0.2500  "), std::string::npos) << progress[1];
  EXPECT_NE(progress[2].find("  loss 0.6250  "), std::string::npos) << progress[2];
  EXPECT_DOUBLE_EQ(rig.trainer->summary().last_loss, 0.75);
}

TEST(ExternalWorkloadTest, TheClientTrainsTheOptimizersOwnParameters) {
  constexpr int64_t kSteps = 200;
  Rig rig(kSteps);
  EXPECT_FALSE(rig.workload->asked());
  absl::Status trained;
  std::thread trainer = rig.Train(&trained);
  std::vector<int64_t> steps;
  for (;;) {
    absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
    ASSERT_TRUE(step.ok()) << step.status();
    if (*step < 0) break;
    steps.push_back(*step);
    ASSERT_TRUE(rig.workload->asked());
    // Zero copies: the parameters are the optimizer's buffer.
    float* p = rig.workload->params();
    ASSERT_EQ(p, rig.trainer->optimizer().params());
    // The gradient too: the trainer reads the client's buffer in place
    // (TrainerLossScalingTest.AWorkloadsOwnGradientBufferIsReadInPlace).
    float* g = rig.workload->gradient();
    ASSERT_EQ(g, rig.workload->gradient_buffer());
    double loss = 0;
    for (size_t i = 0; i < kN; ++i) {
      g[i] = 2.0f * (p[i] - kTarget);
      loss += (p[i] - kTarget) * (p[i] - kTarget);
    }
    ASSERT_TRUE(rig.workload->Supply(*step, WithLoss(loss)).ok());
    EXPECT_EQ(rig.workload->Supply(*step, WithLoss(loss)).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  trainer.join();
  ASSERT_TRUE(trained.ok()) << trained;
  ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
  for (int64_t i = 0; i < kSteps; ++i) EXPECT_EQ(steps[i], i + 1);
  const std::vector<float> p = *rig.trainer->optimizer().ParamsToHost();
  for (float x : p) EXPECT_NEAR(x, kTarget, 0.3f);
  EXPECT_EQ(rig.trainer->summary().last_step, kSteps);
  EXPECT_EQ(rig.trainer->summary().compression.steps, kSteps / 2);
}

// An optimizer with low-precision parameters has no fp32 ones to hand over: the trainer
// asks with null parameters, and the client still learns that it asked.
TEST(ExternalWorkloadTest, ATrainerMayAskWithoutFloatParameters) {
  auto backend = kernels::NewCpuBackend();
  ExternalWorkloadOptions o;
  o.initial = Initial(kN, 0.0f);
  auto w = ExternalWorkload::Create(o, backend.get());
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> grad(kN);
  absl::StatusOr<double> loss;
  std::thread trainer([&] { loss = (*w)->ComputeGradient(nullptr, 1, grad.data()); });
  absl::StatusOr<int64_t> step = (*w)->WaitForStep();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  EXPECT_TRUE((*w)->asked());
  EXPECT_EQ((*w)->params(), nullptr);
  ASSERT_TRUE((*w)->Supply(1, WithLoss(2.0)).ok());
  trainer.join();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(*loss, 2.0);
}

// fp16 loss scaling through the client (onebit.torch's opt.scale(loss)): the client reads
// the trainer's scale for each step and hands in scale * gradient; a step whose gradient
// overflowed is skipped (no parameter moves) and the next step's scale is half.
TEST(ExternalWorkloadTest, TheClientScalesItsLossByTheTrainersScale) {
  LossScalerOptions scaling;
  scaling.initial_scale_power = 3;
  scaling.hysteresis = 1;
  Rig rig(6, scaling);
  absl::Status trained;
  std::thread trainer = rig.Train(&trained);
  std::vector<float> scales;
  std::vector<float> before_overflow;
  for (;;) {
    absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
    ASSERT_TRUE(step.ok()) << step.status();
    if (*step < 0) break;
    const float* p = rig.workload->params();
    if (*step == 4) {  // the step after the overflow changed nothing
      EXPECT_EQ(std::vector<float>(p, p + kN), before_overflow);
    }
    const float scale = rig.workload->loss_scale();
    scales.push_back(scale);
    float* g = rig.workload->gradient();
    for (size_t i = 0; i < kN; ++i) g[i] = scale * 2.0f * (p[i] - kTarget);
    if (*step == 3) {
      before_overflow.assign(p, p + kN);
      g[1] = std::numeric_limits<float>::infinity();
    }
    ASSERT_TRUE(rig.workload->Supply(*step, WithLoss(0.0)).ok());
  }
  trainer.join();
  ASSERT_TRUE(trained.ok()) << trained;
  EXPECT_EQ(scales, (std::vector<float>{8, 8, 8, 4, 4, 4}));
  EXPECT_EQ(rig.trainer->summary().skipped_steps, 1);
  EXPECT_EQ(rig.workload->SetLossScale(0.0f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.workload->SetLossScale(std::numeric_limits<float>::infinity()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.workload->loss_scale(), 4.0f);
}

TEST(ExternalWorkloadTest, AClientThatGoesAwayStopsTheTrainer) {
  Rig rig(50);
  absl::Status trained;
  std::thread trainer([&] { trained = rig.trainer->Run().status(); });
  absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(*step, 1);
  rig.workload->Close(absl::AbortedError("ValueError in train.py"));
  trainer.join();
  EXPECT_EQ(trained.code(), absl::StatusCode::kAborted) << trained;
  EXPECT_NE(trained.message().find("ValueError in train.py"), std::string::npos);
}

TEST(ExternalWorkloadTest, TheTrainersErrorReachesTheClient) {
  Rig rig(50);
  rig.workload->Finish(absl::UnavailableError("peer 2 vanished"));
  absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rig.workload->WaitForStep(absl::Now()).status().code(), absl::StatusCode::kUnavailable);
}

// A script's weight-decay schedule: the groups' decays handed in with a step are what
// ScriptInputs gives for it (none for a step without them); a bad one is refused,
// and the step may then be supplied right.
TEST(ExternalWorkloadTest, TheScriptsWeightDecaysGoWithTheirStep) {
  Rig rig(2);
  absl::Status trained;
  std::thread trainer = rig.Train(&trained);
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  for (;;) {
    absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
    ASSERT_TRUE(step.ok()) << step.status();
    if (*step < 0) break;
    if (*step == 1) {
      for (const double bad : {-0.5, kNone, std::numeric_limits<double>::infinity()}) {
        StepInputs in = WithLoss(1.0);
        in.weight_decays = std::vector<double>{0.1, bad};
        const absl::Status refused = rig.workload->Supply(*step, in);
        EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << bad;
        EXPECT_NE(refused.message().find("the weight decay of parameter group 1 for step 1"),
                  std::string::npos)
            << refused;
      }
      StepInputs in = WithLoss(1.0);
      in.weight_decays = std::vector<double>{0.3};  // the optimizer's one hyper group
      ASSERT_TRUE(rig.workload->Supply(*step, in).ok());
      EXPECT_EQ(rig.workload->ScriptInputs(1).weight_decays, (std::vector<double>{0.3}));
    } else {
      ASSERT_TRUE(rig.workload->Supply(*step, WithLoss(1.0)).ok());
      EXPECT_EQ(rig.workload->ScriptInputs(*step).weight_decays, std::nullopt);
      EXPECT_EQ(rig.workload->ScriptInputs(1).weight_decays, std::nullopt);  // another step's
    }
  }
  trainer.join();
  ASSERT_TRUE(trained.ok()) << trained;
}

// A script's own loss scaler (torch's GradScaler): the scale handed in with a step is
// divided out (the parameters move as with the unscaled gradient), an overflow skips the
// step (the parameters stay) and the client hears so; a bad scale is refused.
TEST(ExternalWorkloadTest, TheScriptsGradScaleIsDividedOutAndAnOverflowSkips) {
  std::vector<std::vector<float>> after;  // the parameters after each step
  for (const double scale : {1.0, 1024.0}) {
    Rig rig(4);
    absl::Status trained;
    std::thread trainer = rig.Train(&trained);
    for (;;) {
      absl::StatusOr<int64_t> step = rig.workload->WaitForStep();
      ASSERT_TRUE(step.ok()) << step.status();
      if (*step < 0) break;
      if (*step > 1) {
        EXPECT_EQ(rig.workload->skipped(*step - 1), *step - 1 == 3);
      }
      float* g = rig.workload->gradient();
      for (size_t i = 0; i < kN; ++i) g[i] = static_cast<float>(scale * (0.25 * i - 0.5));
      if (*step == 3) g[1] = std::numeric_limits<float>::infinity();
      if (*step == 2) {
        for (const double bad : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
          StepInputs in = WithLoss(1.0);
          in.grad_scale = bad;
          EXPECT_EQ(rig.workload->Supply(2, in).code(), absl::StatusCode::kInvalidArgument);
        }
      }
      StepInputs in = WithLoss(1.0);
      in.grad_scale = scale;
      ASSERT_TRUE(rig.workload->Supply(*step, in).ok());
      EXPECT_EQ(rig.workload->ScriptInputs(*step).grad_scale, scale);
    }
    trainer.join();
    ASSERT_TRUE(trained.ok()) << trained;
    after.push_back(std::vector<float>(rig.workload->params(), rig.workload->params() + kN));
  }
  EXPECT_EQ(after[0], after[1]);  // power-of-two scales: the same bits
}

TEST(ExternalWorkloadTest, WaitingForAStepTimesOutAndBadInputIsRefused) {
  auto backend = kernels::NewCpuBackend();
  ExternalWorkloadOptions o;
  o.initial = Initial(4, 1.0f);
  auto w = ExternalWorkload::Create(o, backend.get());
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->WaitForStep(absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ((*w)->Supply(1, WithLoss(0.0)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->parameter_groups(), (std::vector<size_t>{0, 4}));
  EXPECT_EQ((*w)->Evaluate(nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  o.initial = Initial(0, 0.0f);
  EXPECT_EQ(ExternalWorkload::Create(o, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.initial = Initial(4, 1.0f);
  o.groups = {0, 3, 3, 4};
  EXPECT_EQ(ExternalWorkload::Create(o, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.groups = {0, 2};
  EXPECT_EQ(ExternalWorkload::Create(o, backend.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A bf16 gradient buffer (a bf16 model's in a sharded job): the client's writes are what
// the trainer hands the optimizer, in place. Where something would write it in float32
// (buckets, fp16's unscaling, summed micro-batches) or nothing reads it in place (an
// unsharded optimizer), it is refused with the reason.
TEST(ExternalWorkloadTest, ABf16GradientBufferIsReadInPlaceOrRefused) {
  auto backend = kernels::NewCpuBackend();
  ExternalWorkloadOptions o;
  o.initial = Initial(kN, 0.0f);
  o.gradient_dtype = kernels::WireDtype::kBf16;
  auto w = ExternalWorkload::Create(o, backend.get());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->gradient(), nullptr);
  EXPECT_EQ((*w)->gradient_buffer(), nullptr);
  EXPECT_EQ((*w)->gradient_dtype(), kernels::WireDtype::kBf16);
  const std::optional<Gradient> g = (*w)->low_precision_gradient();
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->dtype, kernels::WireDtype::kBf16);
  EXPECT_EQ(g->data, (*w)->gradient_bytes());
  const uint16_t* bits = static_cast<const uint16_t*>(g->data);
  EXPECT_EQ(std::vector<uint16_t>(bits, bits + kN), std::vector<uint16_t>(kN, 0));  // zeroed

  ExternalWorkloadOptions bad = o;
  bad.buckets = {{0, 2}, {2, kN}};
  absl::Status s = ExternalWorkload::Create(bad, backend.get()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap=False"), std::string::npos) << s;
  bad = o;
  bad.gradient_dtype = kernels::WireDtype::kFp16;
  s = ExternalWorkload::Create(bad, backend.get()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("float32 or bf16"), std::string::npos) << s;

  // The trainers that would not read it in place.
  std::shared_ptr<InprocHub> hub = *InprocHub::Create(1);
  std::unique_ptr<Transport> transport = *hub->Connect(0);
  StaticStepController controller(/*freeze_step=*/2, /*steps=*/4);
  const auto refused = [&](TrainerOptions options, absl::StatusCode code,
                           const std::string& why) {
    options.eval_at_end = false;
    const absl::Status made = Trainer::Create(options, w->get(), backend.get(),
                                              transport.get(), &controller)
                                  .status();
    EXPECT_EQ(made.code(), code) << made;
    EXPECT_NE(made.message().find(why), std::string::npos) << made;
  };
  TrainerOptions plain;
  refused(plain, absl::StatusCode::kFailedPrecondition, "onebit.exchange.shard_state");
  TrainerOptions accumulating;
  accumulating.gradient_accumulation_steps = 2;
  refused(accumulating, absl::StatusCode::kInvalidArgument, "micro-batches are summed");
  TrainerOptions scaled;
  scaled.loss_scaling = LossScalerOptions();
  refused(scaled, absl::StatusCode::kInvalidArgument, "bf16 needs no loss scaling");
}

// OVERLAP: buckets announced during the step reach the trainer's buffer and its listener
// at once, in order; Supply announces the rest; out-of-order, late and bad ones are refused.
TEST(ExternalWorkloadTest, AnnouncedBucketsReachTheTrainerInOrder) {
  struct Recorder : GradientListener {
    absl::Mutex mu;
    std::vector<ParamRange> seen ABSL_GUARDED_BY(mu);
    void GradientReady(size_t begin, size_t end) override {
      absl::MutexLock lock(&mu);
      seen.push_back({begin, end});
    }
    std::vector<ParamRange> Seen() {
      absl::MutexLock lock(&mu);
      return seen;
    }
  };
  auto backend = kernels::NewCpuBackend();
  ExternalWorkloadOptions o;
  o.initial = Initial(kN, 0.0f);
  o.buckets = {{3, kN}, {1, 3}, {0, 1}};  // the last layer's first, as backward ends them
  auto made = ExternalWorkload::Create(o, backend.get());
  ASSERT_TRUE(made.ok()) << made.status();
  ExternalWorkload& w = **made;
  EXPECT_EQ(w.gradient_buckets(), o.buckets);
  EXPECT_EQ(w.gradient_buffer(), nullptr);  // the buckets are copied into the trainer's
  Recorder recorder;
  w.set_gradient_listener(&recorder);
  EXPECT_EQ(w.Announce(1, 0).code(), absl::StatusCode::kFailedPrecondition);  // no step yet

  std::vector<float> grad_out(kN, -1.0f);
  absl::StatusOr<double> loss;
  std::thread trainer([&] { loss = w.ComputeGradient(o.initial->data(), 1, grad_out.data()); });
  ASSERT_EQ(*w.WaitForStep(), 1);
  for (size_t i = 0; i < kN; ++i) w.gradient()[i] = 10.0f + i;
  EXPECT_EQ(w.Announce(1, 1).code(), absl::StatusCode::kFailedPrecondition);  // not next
  EXPECT_EQ(w.Announce(2, 0).code(), absl::StatusCode::kFailedPrecondition);  // not the step
  ASSERT_TRUE(w.Announce(1, 0).ok());
  EXPECT_EQ(recorder.Seen(), (std::vector<ParamRange>{{3, kN}}));
  EXPECT_EQ(grad_out, (std::vector<float>{-1, -1, -1, 13, 14}));  // bucket 0 only, already
  EXPECT_EQ(w.Announce(1, 0).code(), absl::StatusCode::kFailedPrecondition);  // twice
  EXPECT_EQ(w.ChangedSinceAnnounced(), -1);
  w.gradient()[4] = 0.5f;  // changed after it went out
  EXPECT_EQ(w.ChangedSinceAnnounced(), 4);
  w.gradient()[4] = 14.0f;
  w.gradient()[0] = 0.5f;  // not announced yet: free to change
  EXPECT_EQ(w.ChangedSinceAnnounced(), -1);
  w.gradient()[0] = 10.0f;
  ASSERT_TRUE(w.Supply(1, WithLoss(0.5)).ok());  // buckets 1 and 2 with it
  trainer.join();
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_EQ(*loss, 0.5);
  EXPECT_EQ(recorder.Seen(), (std::vector<ParamRange>{{3, kN}, {1, 3}, {0, 1}}));
  EXPECT_EQ(grad_out, (std::vector<float>{10, 11, 12, 13, 14}));
  EXPECT_EQ(w.Announce(1, 1).code(), absl::StatusCode::kFailedPrecondition);  // step over

  // Buckets that are no partition of [0, n).
  for (const std::vector<ParamRange>& bad : std::vector<std::vector<ParamRange>>{
           {{0, 2}, {3, kN}}, {{0, 3}, {2, kN}}, {{0, kN}, {kN, kN}}, {{0, 4}}}) {
    o.buckets = bad;
    absl::Status s = ExternalWorkload::Create(o, backend.get()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  // Without buckets there is nothing to announce.
  o.buckets.clear();
  EXPECT_EQ((*ExternalWorkload::Create(o, backend.get()))->Announce(1, 0).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace onebit
