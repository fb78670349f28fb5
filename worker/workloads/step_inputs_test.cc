#include "worker/workloads/step_inputs.h"

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The error of `inputs` at step 7: INVALID_ARGUMENT, its message returned.
std::string Refusal(const StepInputs& inputs) {
  const absl::Status s = ValidateStepInputs(7, inputs);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(StepInputsTest, NothingSetAndValuesInRangeAreAccepted) {
  EXPECT_TRUE(ValidateStepInputs(1, StepInputs{}).ok());
  StepInputs in;
  in.loss = kNan;  // the trainer's to report
  in.lr = 0.0;
  in.max_grad_norm = 0.0;
  in.grad_scale = 65536.0;
  in.betas = std::make_pair(0.0, 0.999);
  in.weight_decays = std::vector<double>{0.0, 0.01};
  EXPECT_TRUE(ValidateStepInputs(1, in).ok());
}

TEST(StepInputsTest, EachFieldOutOfRangeIsNamedWithItsStep) {
  for (const double bad : {-1.0, kNan, kInf}) {
    StepInputs lr;
    lr.lr = bad;
    EXPECT_THAT(Refusal(lr), HasSubstr("the learning rate of step 7 is "));
    StepInputs norm;
    norm.max_grad_norm = bad;
    EXPECT_THAT(Refusal(norm), HasSubstr("the gradient-clipping norm of step 7 is "));
    StepInputs scale;
    scale.grad_scale = bad;
    EXPECT_THAT(Refusal(scale), HasSubstr("the gradient scale of step 7 is "));
    StepInputs decays;
    decays.weight_decays = std::vector<double>{0.1, bad};
    EXPECT_THAT(Refusal(decays),
                HasSubstr("the weight decay of parameter group 1 for step 7 is "));
  }
  StepInputs zero_scale;
  zero_scale.grad_scale = 0.0;
  EXPECT_THAT(Refusal(zero_scale), HasSubstr("it must be finite and > 0"));
  StepInputs lr;
  lr.lr = -0.5;
  EXPECT_EQ(Refusal(lr), "the learning rate of step 7 is -0.5; it must be >= 0");
  for (const auto& bad : {std::make_pair(1.0, 0.9), std::make_pair(0.9, -0.1),
                          std::make_pair(kNan, 0.9), std::make_pair(0.9, kNan)}) {
    StepInputs betas;
    betas.betas = bad;
    EXPECT_THAT(Refusal(betas), HasSubstr("each must be in [0, 1)"));
  }
  StepInputs betas;
  betas.betas = std::make_pair(1.0, 0.5);
  EXPECT_EQ(Refusal(betas), "the betas of step 7 are (1, 0.5); each must be in [0, 1)");
  StepInputs none;
  none.weight_decays = std::vector<double>{};
  EXPECT_THAT(Refusal(none), HasSubstr("the weight decays of step 7 are an empty list"));
}

}  // namespace
}  // namespace onebit
