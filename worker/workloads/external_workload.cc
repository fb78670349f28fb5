#include "worker/workloads/external_workload.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit {

absl::StatusOr<std::unique_ptr<ExternalWorkload>> ExternalWorkload::Create(
    ExternalWorkloadOptions options, kernels::Backend* backend) {
  const size_t n = options.initial == nullptr ? 0 : options.initial->size();
  if (n == 0) return absl::InvalidArgumentError("the model has no parameters");
  if (options.groups.empty()) options.groups = {0, n};
  const std::vector<size_t>& g = options.groups;
  if (g.size() < 2 || g.front() != 0 || g.back() != n ||
      std::adjacent_find(g.begin(), g.end(), [](size_t a, size_t b) { return a >= b; }) !=
          g.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter groups must rise strictly from 0 to the parameter count ", n));
  }
  if (!options.buckets.empty()) {
    if (backend->memory_space() != kernels::MemorySpace::kHost) {
      return absl::InvalidArgumentError(
          "gradient buckets (overlap) need host memory: on a GPU the client's copies would "
          "race the exchange on the backend's stream");
    }
    std::vector<ParamRange> sorted = options.buckets;
    std::sort(sorted.begin(), sorted.end(),
              [](const ParamRange& a, const ParamRange& b) { return a.begin < b.begin; });
    size_t covered = 0;
    for (const ParamRange& r : sorted) {
      if (r.begin != covered || r.end <= r.begin) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gradient buckets must partition [0, ", n, ") into non-empty ranges; [", r.begin,
            ", ", r.end, ") does not follow [0, ", covered, ")"));
      }
      covered = r.end;
    }
    if (covered != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient buckets cover [0, ", covered, "), the model has ", n));
    }
  }
  kernels::Buffer<float> gradient;
  kernels::Buffer<uint16_t> gradient16;
  if (options.gradient_dtype == kernels::WireDtype::kFp32) {
    ONEBIT_ASSIGN_OR_RETURN(gradient, kernels::Buffer<float>::Create(backend, n));
    ONEBIT_RETURN_IF_ERROR(gradient.Zero());
  } else if (options.gradient_dtype == kernels::WireDtype::kBf16) {
    if (!options.buckets.empty()) {
      return absl::InvalidArgumentError(
          "gradient buckets (overlap) with a bf16 gradient buffer: the overlapped warmup sums "
          "float32 gradients; build the optimizer with overlap=False");
    }
    ONEBIT_ASSIGN_OR_RETURN(gradient16, kernels::Buffer<uint16_t>::Create(backend, n));
    ONEBIT_RETURN_IF_ERROR(gradient16.Zero());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("a gradient buffer of ", kernels::WireDtypeName(options.gradient_dtype),
                     ": float32 or bf16 only (fp16 gradients are unscaled in place, which "
                     "needs float32)"));
  }
  return std::unique_ptr<ExternalWorkload>(new ExternalWorkload(
      std::move(options), backend, std::move(gradient), std::move(gradient16)));
}

std::optional<Gradient> ExternalWorkload::low_precision_gradient() const {
  if (!low_precision()) return std::nullopt;
  return Gradient(gradient16_.data(), gradient_dtype_);
}

ExternalWorkload::ExternalWorkload(ExternalWorkloadOptions options, kernels::Backend* backend,
                                   kernels::Buffer<float> gradient,
                                   kernels::Buffer<uint16_t> gradient16)
    : backend_(backend),
      name_(std::move(options.name)),
      initial_(std::move(options.initial)),
      groups_(std::move(options.groups)),
      buckets_(std::move(options.buckets)),
      gradient_dtype_(options.gradient_dtype),
      gradient_(std::move(gradient)),
      gradient16_(std::move(gradient16)) {}

absl::Status ExternalWorkload::InitParameters(float* host_params, uint64_t /*seed*/) const {
  std::memcpy(host_params, initial_->data(), initial_->size() * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<double> ExternalWorkload::ComputeGradient(const float* params, int64_t step,
                                                         float* grad_out) {
  {
    absl::MutexLock lock(&mu_);
    params_ = params;
    asked_ = true;
    grad_out_ = grad_out;
    announced_ = 0;
    wanted_ = step;
    auto ready = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return closed_ || supplied_ == step || (ended_after_ >= 0 && step > ended_after_);
    };
    mu_.Await(absl::Condition(&ready));
    wanted_ = 0;
    grad_out_ = nullptr;
    if (supplied_ != step && ended_after_ >= 0 && step > ended_after_) {
      return absl::OutOfRangeError(
          absl::StrCat("the training script's loop ended after step ", ended_after_));
    }
    if (supplied_ != step) {
      return close_status_.ok() ? absl::CancelledError("the training script went away")
                                : close_status_;
    }
  }
  // With buckets, Announce/Supply copied them all. A 16-bit gradient stays where it is
  // (low_precision_gradient; grad_out null).
  if (low_precision()) {
    if (grad_out != nullptr) {
      return absl::InternalError("a bf16 gradient buffer is read in place, not copied out");
    }
  } else if (buckets_.empty() && grad_out != gradient_.data()) {
    ONEBIT_RETURN_IF_ERROR(
        backend_->Copy(grad_out, gradient_.data(), gradient_.size() * sizeof(float)));
  }
  absl::MutexLock lock(&mu_);
  return inputs_.loss.value_or(0.0);
}

absl::StatusOr<EvalResult> ExternalWorkload::Evaluate(const float* /*params*/) {
  return absl::FailedPreconditionError(
      "an external workload evaluates its model itself; the trainer's evaluation must be off");
}

absl::Status ExternalWorkload::SetLossScale(float scale) {
  if (!(scale > 0) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat("loss scale must be finite and > 0, got ", scale));
  }
  absl::MutexLock lock(&mu_);
  loss_scale_ = scale;
  return absl::OkStatus();
}

float ExternalWorkload::loss_scale() const {
  absl::MutexLock lock(&mu_);
  return loss_scale_;
}

absl::StatusOr<int64_t> ExternalWorkload::WaitForStep(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  // A step past the loop's end is no step to ask the script for: the run is ending.
  auto asks = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return wanted_ > 0 && supplied_ != wanted_ && (ended_after_ < 0 || wanted_ <= ended_after_);
  };
  auto ready = [this, &asks]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ || asks(); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::UnavailableError("the trainer asked for no step in time");
  }
  if (asks()) return wanted_;
  if (!finish_status_.ok()) return finish_status_;
  return -1;
}

bool ExternalWorkload::loss_given() const {
  absl::MutexLock lock(&mu_);
  return supplied_ == 0 || inputs_.loss.has_value();
}

absl::Status ExternalWorkload::Supply(int64_t step, StepInputs inputs) {
  absl::MutexLock lock(&mu_);
  if (wanted_ != step || supplied_ == step) {
    return absl::FailedPreconditionError(
        absl::StrCat("a gradient for step ", step, " while the trainer ",
                     wanted_ > 0 ? absl::StrCat("waits for step ", wanted_)
                                 : std::string("waits for none")));
  }
  ONEBIT_RETURN_IF_ERROR(ValidateStepInputs(step, inputs));
  for (size_t b = announced_; b < buckets_.size(); ++b) AnnounceLocked(b);
  inputs_ = std::move(inputs);
  supplied_ = step;
  return absl::OkStatus();
}

absl::Status ExternalWorkload::Announce(int64_t step, size_t bucket) {
  absl::MutexLock lock(&mu_);
  if (buckets_.empty()) {
    return absl::FailedPreconditionError("the workload was made without gradient buckets");
  }
  if (wanted_ != step || supplied_ == step) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucket ", bucket, " of step ", step, " while the trainer ",
                     wanted_ > 0 ? absl::StrCat("waits for step ", wanted_)
                                 : std::string("waits for none")));
  }
  if (bucket != announced_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket ", bucket, " of step ", step, " announced; the next is ",
        announced_ < buckets_.size() ? absl::StrCat("bucket ", announced_)
                                     : std::string("none (all were)")));
  }
  AnnounceLocked(bucket);
  return absl::OkStatus();
}

int64_t ExternalWorkload::ChangedSinceAnnounced() {
  absl::MutexLock lock(&mu_);
  if (grad_out_ == nullptr || grad_out_ == gradient_.data() || supplied_ == wanted_) return -1;
  for (size_t b = 0; b < announced_; ++b) {
    const ParamRange& r = buckets_[b];
    const size_t bytes = (r.end - r.begin) * sizeof(float);
    if (std::memcmp(grad_out_ + r.begin, gradient_.data() + r.begin, bytes) == 0) continue;
    for (size_t i = r.begin; i < r.end; ++i) {
      if (std::memcmp(grad_out_ + i, gradient_.data() + i, sizeof(float)) != 0) {
        return static_cast<int64_t>(i);
      }
    }
  }
  return -1;
}

void ExternalWorkload::AnnounceLocked(size_t bucket) {
  const ParamRange& r = buckets_[bucket];
  if (grad_out_ != gradient_.data()) {
    std::memcpy(grad_out_ + r.begin, gradient_.data() + r.begin,
                (r.end - r.begin) * sizeof(float));
  }
  announced_ = bucket + 1;
  AnnounceGradient(r.begin, r.end);
}

StepInputs ExternalWorkload::ScriptInputs(int64_t step) const {
  absl::MutexLock lock(&mu_);
  if (supplied_ != step) return {};
  return inputs_;
}

void ExternalWorkload::StepEnded(int64_t step, bool skipped) {
  absl::MutexLock lock(&mu_);
  if (skipped) skipped_step_ = step;
}

bool ExternalWorkload::skipped(int64_t step) const {
  absl::MutexLock lock(&mu_);
  return skipped_step_ == step;
}

absl::Status ExternalWorkload::EndAfter(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (step != supplied_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the loop can only end after the last step it supplied (", supplied_, "), not ", step));
  }
  ended_after_ = step;
  return absl::OkStatus();
}

std::optional<int64_t> ExternalWorkload::ended_after() const {
  absl::MutexLock lock(&mu_);
  if (ended_after_ < 0) return std::nullopt;
  return ended_after_;
}

void ExternalWorkload::Close(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  closed_ = true;
  close_status_ = std::move(why);
}

float* ExternalWorkload::params() {
  absl::MutexLock lock(&mu_);
  return const_cast<float*>(params_);
}

void ExternalWorkload::SetParams(const float* params) {
  absl::MutexLock lock(&mu_);
  params_ = params;
  asked_ = true;
}

bool ExternalWorkload::asked() const {
  absl::MutexLock lock(&mu_);
  return asked_;
}

void ExternalWorkload::Finish(absl::Status status) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  finish_status_ = std::move(status);
}

}  // namespace onebit
