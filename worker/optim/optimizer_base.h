// What the three optimizers share: the options every one takes, and a base that holds the
// state every one has (p, m, v, the momentum mask, the gradient clipper, the step count)
// with the Optimizer methods that only read or set it, and the checkpoint methods over
// named buffers. Each optimizer keeps its own update math, its own hyper-parameters per
// step and its own checkpoint scalars.
//
// Thread safety: one thread at a time, as Optimizer. The backend and the exchange are
// borrowed and must outlive the optimizer.
#ifndef ONEBIT_WORKER_OPTIM_OPTIMIZER_BASE_H_
#define ONEBIT_WORKER_OPTIM_OPTIMIZER_BASE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "kernels/wire_dtype.h"
#include "worker/exchange/exchange.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/optim/gradient_clipper.h"
#include "worker/optim/momentum_mask.h"
#include "worker/optim/optim_checks.h"
#include "worker/optim/optimizer.h"
#include "worker/optim/sliced_reductions.h"
#include "worker/transport/transport.h"

namespace onebit {

// The options of every optimizer. Each optimizer's options add their own fields (the last
// warmup step among them) and say where a field means something particular to them.
struct CommonOptimizerOptions {
  kernels::AdamHyper hyper;
  // Optional {0,1} momentum mask of n elements (host memory), applied after every
  // compressed exchange. Empty means no mask.
  std::vector<float> momentum_mask;
  // Also mask the parameters whose exactly averaged gradient stays exactly zero through
  // warmup (momentum_mask.h).
  bool auto_mask_zero_gradients = false;
  // Bias-corrected moments (optim_checks.h's BiasCorrectedHyper). Off by default, as in
  // docs/algorithms.md.
  bool bias_correction = false;
  // Gradient clipping by global norm (gradient_clipper.h); 0: off.
  double max_grad_norm = 0.0;
  // Parameter groups with their own lr and weight decay (optim_checks.h); empty: one group
  // with hyper's.
  std::vector<HyperGroup> hyper_groups;
  // The model's parameter format: fp32, or bf16 / fp16 when every parameter the model
  // trains has that type (the warmup wire's formats and conversions: wire_dtype.h). It
  // changes anything only over a sharded exchange (LOW-PRECISION PARAMETERS below);
  // unsharded, p is the whole fp32 master and the model casts it itself.
  kernels::WireDtype param_dtype = kernels::WireDtype::kFp32;
};

// SHARDED STATE (docs/design.md, "Sharded state"). Over an exchange with a state shard
// (Exchange::state_shard), m, v and every buffer InitCommon names hold only the shard's
// parameters [state_begin(), state_begin() + state_count()), allocated at the shard's
// stride and zero past its count; the mask holds the shard's count. p stays whole,
// padded to the node's pieces x stride, and SyncParams all-gathers it inside the node
// after each update. Unsharded, the state range is [0, n) and nothing is padded.
//
// LOW-PRECISION PARAMETERS (docs/algorithms.md, "Mixed precision"). Sharded with a bf16 or
// fp16 param_dtype, p is the fp32 master of the state range only (stride elements, zero
// past its count). The model's parameters are low_params(): pieces x stride elements of
// param_dtype. After each update SyncParams casts the shard (round to nearest even, as
// torch's copy_ from float32 does) into its slice of low_params() and all-gathers those at
// 2 bytes per parameter. params() is then null; ParamsToHost widens low_params(); the
// checkpoint's "params" is the master over the state range, so a resume is exact.
//
// Derived: the optimizer, which makes OptimizerBase a friend and has
//   static absl::Status ValidateOptions(const Options&, size_t n);
//   absl::Status Init(std::vector<HyperGroup> groups, const float* initial_params);
// (Init takes the resolved parameter groups, then calls InitCommon). It may hide the
// checkpoint hooks below (TensorStates, OwnScalars, ReadScalars) with its own, and
// kCannotShard with the reason it refuses a sharded exchange.
// Options: a struct derived from CommonOptimizerOptions; kFreezeStep: its field with the
// last warmup step. The stage is kWarmup through that step and kCompression after it.
template <typename Derived, typename Options, int64_t Options::*kFreezeStep>
class OptimizerBase : public Optimizer {
 public:
  // `initial_params` is host memory with n elements. The exchange is borrowed and must
  // outlive the optimizer; it is not used with one worker. INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<Derived>> Create(const Options& options,
                                                         kernels::Backend* backend,
                                                         Exchange* exchange,
                                                         const float* initial_params, size_t n) {
    ONEBIT_RETURN_IF_ERROR(Derived::ValidateOptions(options, n));
    ONEBIT_ASSIGN_OR_RETURN(
        std::vector<HyperGroup> groups,
        ResolveHyperGroups(options.hyper_groups, n, options.hyper.weight_decay));
    std::unique_ptr<Derived> optimizer(new Derived(options, backend, exchange, n));
    ONEBIT_RETURN_IF_ERROR(optimizer->AdoptShard());
    ONEBIT_RETURN_IF_ERROR(optimizer->AgreeOnParamDtype());
    ONEBIT_RETURN_IF_ERROR(optimizer->Init(std::move(groups), initial_params));
    return optimizer;
  }
  // The same over a PeerExchange on `transport`, which the optimizer owns.
  static absl::StatusOr<std::unique_ptr<Derived>> Create(const Options& options,
                                                         kernels::Backend* backend,
                                                         Transport* transport,
                                                         const float* initial_params, size_t n) {
    ONEBIT_RETURN_IF_ERROR(Derived::ValidateOptions(options, n));
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PeerExchange> exchange,
                            PeerExchange::Create(backend, transport, n));
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Derived> optimizer,
                            Create(options, backend, exchange.get(), initial_params, n));
    optimizer->owned_exchange_ = std::move(exchange);
    return optimizer;
  }

  // OK for a float32 gradient; for a 16-bit one (gradient.h) only where every read of it
  // goes through the exchange's sharded calls and the clipper's ClipScale: a sharded
  // worker (so not 0/1 Adam, which cannot shard). FAILED_PRECONDITION otherwise.
  absl::Status CheckGradient(const Gradient& grad) const override {
    if (grad.is_fp32() || (sharded_ && exchange_->world_size() > 1)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "a ", kernels::WireDtypeName(grad.dtype),
        " gradient buffer is read only by a sharded optimizer state "
        "(onebit.exchange.shard_state, hierarchical, two or more workers a node; OneBitAdam, "
        "Adam or OneBitLamb); keep the gradient buffer float32"));
  }
  // Counts the step and changes no state.
  absl::Status SkipStep() override {
    ++step_;
    return absl::OkStatus();
  }
  Stage stage() const override {
    return step_ + 1 <= freeze_step() ? Stage::kWarmup : Stage::kCompression;
  }
  int64_t step() const override { return step_; }
  int64_t freeze_step() const override { return options_.*kFreezeStep; }
  // Moves the switch. Must not be at or before a step already run in compression, and
  // must be called with the same value on every worker before the step it concerns.
  absl::Status SetFreezeStep(int64_t freeze_step) override {
    ONEBIT_RETURN_IF_ERROR(CheckFreezeStepMove(step_, options_.*kFreezeStep, freeze_step));
    options_.*kFreezeStep = freeze_step;
    return absl::OkStatus();
  }
  void set_lr(float lr) override { options_.hyper.lr = lr; }
  float lr() const override { return options_.hyper.lr; }
  void set_betas(float beta1, float beta2) override {
    options_.hyper.beta1 = beta1;
    options_.hyper.beta2 = beta2;
  }
  absl::Status set_max_grad_norm(double max_norm) override { return clip_.SetMaxNorm(max_norm); }
  // One decay per parameter group, in group order.
  absl::Status set_weight_decays(const std::vector<double>& decays) override {
    return SetGroupWeightDecays(decays, &hyper_groups_);
  }
  std::vector<double> weight_decays() const override { return GroupWeightDecays(hyper_groups_); }

  size_t size() const override { return n_; }
  size_t state_begin() const override { return state_begin_; }
  size_t state_count() const override { return state_count_; }
  // Backend memory: p has n elements (null with low-precision parameters), v the state
  // range's.
  const float* params() const override { return low_ ? nullptr : p_.data(); }
  const float* variance() const override { return v_.data(); }
  // With low-precision parameters: their n values, widened to fp32 (exact).
  absl::StatusOr<std::vector<float>> ParamsToHost() const override {
    if (!low_) return p_.SliceToHost(0, n_);
    ONEBIT_ASSIGN_OR_RETURN(const std::vector<uint16_t> low, p_low_.SliceToHost(0, n_));
    std::vector<float> out(n_);
    for (size_t i = 0; i < n_; ++i) out[i] = kernels::WidenParam(options_.param_dtype, low[i]);
    return out;
  }
  const void* low_params() const override { return low_ ? p_low_.data() : nullptr; }
  kernels::WireDtype low_params_dtype() const override {
    return low_ ? options_.param_dtype : kernels::WireDtype::kFp32;
  }
  // The gradient norm the clipper measured last (0 before any, or with clipping off).
  double last_clip_norm() const { return clip_.last_norm(); }
  // Sharded: the elements of this worker's state range the mask zeroes.
  int64_t masked_elements() const override { return mask_.masked(); }
  // p, m, v and every buffer InitCommon made (scratch included), the mask and the clipper.
  uint64_t state_bytes() const override {
    uint64_t bytes = mask_.bytes() + clip_.bytes();
    for (const kernels::Buffer<float>* b : owned_buffers_) bytes += b->bytes();
    return bytes + p_low_.bytes();  // low-precision parameters: the model's, padded
  }
  Exchange& exchange() override { return *exchange_; }
  // Seconds Step() has spent inside the exchange's calls so far, read on the exchange's
  // step_clock(); the rest of a Step is the update. Cumulative.
  double exchange_call_seconds() const override { return exchange_call_seconds_; }

  // Checkpoints: Derived's TensorStates, then the mask's; the buffers by name.
  std::vector<StateSpec> CheckpointStates() const override {
    std::vector<StateSpec> states = derived().TensorStates(step_, freeze_step());
    mask_.AddCheckpointStates(&states);
    return states;
  }
  absl::StatusOr<std::vector<float>> StateToHost(const std::string& name, size_t begin,
                                                 size_t end) const override {
    const kernels::Buffer<float>* b = FindBuffer(name);
    if (b == &p_ && !low_) {  // whole on every worker, sharded or not (but the master)
      if (end > n_) return absl::InvalidArgumentError(absl::StrCat("params has ", n_, " elements"));
      return p_.SliceToHost(begin, end);
    }
    if (begin < state_begin_ || end > state_begin_ + state_count_ || begin > end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state ", name, " [", begin, ", ", end, ") is not held here: this worker ",
          "holds [", state_begin_, ", ", state_begin_ + state_count_, ") (sharded state)"));
    }
    if (b == nullptr) return mask_.StateToHost(name, begin - state_begin_, end - state_begin_);
    if (b == &p_) return p_.SliceToHost(begin - state_begin_, end - state_begin_);  // master
    return b->SliceToHost(begin - state_begin_, end - state_begin_);
  }
  StateScalars CheckpointScalars() const override {
    StateScalars scalars = derived().OwnScalars();
    mask_.AddCheckpointScalars(&scalars);
    return scalars;
  }
  // Checks every tensor and scalar before it changes anything. The switch moves to
  // `freeze_step` if it had passed (0 <= freeze_step < step). The next Step() is step + 1.
  absl::Status Restore(int64_t step, int64_t freeze_step, const StateTensors& states,
                       const StateScalars& scalars) override {
    if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", step));
    const int64_t at = freeze_step >= 0 && freeze_step < step ? freeze_step : this->freeze_step();
    std::vector<std::pair<kernels::Buffer<float>*, const std::vector<float>*>> copies;
    for (const StateSpec& spec : derived().TensorStates(step, at)) {
      ONEBIT_ASSIGN_OR_RETURN(const std::vector<float>* values,
                              FindState(states, spec.name, spec.shared ? state_count_ : n_));
      copies.emplace_back(FindBuffer(spec.name), values);
    }
    ONEBIT_ASSIGN_OR_RETURN(RestoreCommit commit, derived().ReadScalars(step, at, scalars));
    ONEBIT_RETURN_IF_ERROR(mask_.Restore(states, scalars));
    for (auto& [buffer, values] : copies) {
      const size_t at_element = buffer == &p_ && !low_ ? state_begin_ : 0;
      ONEBIT_RETURN_IF_ERROR(buffer->CopyFromHostAt(at_element, values->data(), values->size()));
    }
    ONEBIT_RETURN_IF_ERROR(commit());
    options_.*kFreezeStep = at;
    step_ = step;
    return SyncParams();
  }

 protected:
  // A buffer with its checkpoint name; a null name is scratch, never saved.
  struct NamedBuffer {
    const char* name;
    kernels::Buffer<float>* buffer;
  };
  // Applies what ReadScalars read, after the tensors are restored.
  using RestoreCommit = std::function<absl::Status()>;

  // The checkpoint hooks' defaults: the three shared tensors, no scalars of one's own.
  // TensorStates says which tensors a checkpoint at (step, freeze_step) holds: each one a
  // named buffer.
  std::vector<StateSpec> TensorStates(int64_t /*step*/, int64_t /*freeze_step*/) const {
    return {{"params", true}, {"exp_avg", true}, {"exp_avg_sq", true}};
  }
  StateScalars OwnScalars() const { return {}; }
  // Reads Derived's scalars for a checkpoint at (step, freeze_step) without changing
  // anything; the commit applies them.
  absl::StatusOr<RestoreCommit> ReadScalars(int64_t /*step*/, int64_t /*freeze_step*/,
                                            const StateScalars& /*scalars*/) {
    return RestoreCommit([] { return absl::OkStatus(); });
  }

  const kernels::Buffer<float>* FindBuffer(const std::string& name) const {
    for (const auto& [n, b] : named_) {
      if (name == n) return b;
    }
    return nullptr;
  }
  kernels::Buffer<float>* FindBuffer(const std::string& name) {
    return const_cast<kernels::Buffer<float>*>(std::as_const(*this).FindBuffer(name));
  }

  // An optimizer that refuses a sharded exchange names the reason here (Derived's own
  // kCannotShard hides this one).
  static constexpr const char* kCannotShard = nullptr;

  OptimizerBase(const Options& options, kernels::Backend* backend, Exchange* exchange, size_t n)
      : options_(options), backend_(backend), exchange_(exchange), n_(n), state_count_(n) {}

  // The parameter groups cut to the state range, with begin and end counted from
  // state_begin() (the groups themselves unsharded); empty intersections are dropped.
  std::vector<HyperGroup> StateGroups() const {
    if (!sharded_) return hyper_groups_;
    std::vector<HyperGroup> cut;
    const size_t lo = state_begin_, hi = state_begin_ + state_count_;
    for (HyperGroup g : hyper_groups_) {
      const size_t b = std::max(g.begin, lo), e = std::min(g.end, hi);
      if (b >= e) continue;
      g.begin = b - lo;
      g.end = e - lo;
      cut.push_back(g);
    }
    return cut;
  }
  // How a reduction's float64 partials combine: AddInOrder or MaxNanWins.
  using Combine = double (*)(absl::Span<const double>);
  // The canonical pieces of `range` (global indices; sliced_reductions.h) that the state
  // range holds: all of them unsharded, sharded at most one (the one in this slice).
  std::vector<ElementRange> StatePieces(ElementRange range) const {
    const size_t stride = exchange_->reduction_stride();
    return sharded_ ? CutAtStride(range, stride, {state_begin_, state_begin_ + state_count_})
                    : CutAtStride(range, stride);
  }
  // The second half of a batch of reductions whose partials the caller computed:
  // mine[r] is combine[r] of this worker's StatePieces of reduction r. Unsharded, that is
  // the result. Sharded, one GatherPartials inside the node (a collective of every local
  // rank, with the same reductions in the same order), then each reduction's values
  // combined in slice order. Work that reads none of the results may go between the
  // halves, so a step needs one gather however many reductions it has.
  absl::StatusOr<std::vector<double>> CombineInNode(std::vector<double> mine,
                                                    absl::Span<const Combine> combine) {
    const size_t k = mine.size();
    if (combine.size() != k) {
      return absl::InternalError(absl::StrCat(k, " partials with ", combine.size(),
                                              " ways to combine them"));
    }
    if (!sharded_) return mine;
    ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> all, exchange_->GatherPartials(mine));
    ONEBIT_ASSIGN_OR_RETURN(const std::vector<std::vector<double>> by_slice,
                            PartialsBySlice(all, k));
    for (size_t r = 0; r < k; ++r) mine[r] = combine[r](by_slice[r]);
    return mine;
  }
  // Reductions over whole ranges of parameters (global indices) in the canonical order
  // (sliced_reductions.h). x (backend memory) holds the state range: element state_begin()
  // at x[0]. `partials` gives the float64 partials of a list of pieces, in order; `combine`
  // adds them (AddInOrder) or takes their maximum (MaxNanWins). Sharded: each worker
  // reduces its own piece of each range, then one GatherPartials (CombineInNode).
  template <typename Partials>
  absl::StatusOr<std::vector<double>> StateReduce(const std::vector<ElementRange>& ranges,
                                                  Partials partials, Combine combine) {
    std::vector<double> mine;
    for (const ElementRange& range : ranges) {
      ONEBIT_ASSIGN_OR_RETURN(std::vector<double> pieces, partials(StatePieces(range)));
      mine.push_back(combine(pieces));  // sharded: the one piece in this slice, or 0.0
    }
    return CombineInNode(std::move(mine), std::vector<Combine>(ranges.size(), combine));
  }
  // ||x||^2 over each range (x as above).
  absl::StatusOr<std::vector<double>> StateSumSquares(const float* x,
                                                      const std::vector<ElementRange>& ranges) {
    return StateReduce(
        ranges,
        [&](const std::vector<ElementRange>& pieces) {
          return SumSquaresOfPieces(*backend_, x, state_begin_, pieces);
        },
        &AddInOrder);
  }
  // The warmup's clip factor of scale * the exact sum (the state range's, backend memory).
  absl::StatusOr<double> ExactSumClipFactor(const float* sum, double scale) {
    if (!clip_.enabled()) return 1.0;
    ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> sumsq,
                            StateSumSquares(sum, {ElementRange{0, n_}}));
    return clip_.FactorOf(sumsq[0], scale);
  }
  // The parameters of the state range (backend memory, state_count() elements; with
  // low-precision parameters, their fp32 master).
  float* state_params() { return low_ ? p_.data() : p_.data() + state_begin_; }
  bool sharded() const { return sharded_; }
  // Sharded: every local rank's updated slice of p into every local rank's p (exact; a
  // collective of the node's workers). With low-precision parameters, the master shard
  // cast into its slice of low_params() first, then those all-gathered. Unsharded: nothing.
  absl::Status SyncParams() {
    if (!sharded_) return absl::OkStatus();
    if (low_) {
      // The whole stride: its padding is zero in the master, so in low_params() too.
      ONEBIT_RETURN_IF_ERROR(backend_->ToWire(options_.param_dtype, p_.data(), state_alloc_,
                                              p_low_.data() + shard_piece_ * state_alloc_));
    }
    ScopedStepTime time(exchange_->step_clock(), &exchange_call_seconds_);
    if (low_) return exchange_->AllGatherShardBytes(p_low_.data(), sizeof(uint16_t));
    return exchange_->AllGatherShards(p_.data());
  }

  // Allocates p (a copy of `initial_params`, host memory, n elements), m, v and then
  // `more`, all zero, in that order; then the mask and the clipper from the options.
  // p, m and v are named "params", "exp_avg" and "exp_avg_sq". With low-precision
  // parameters p is the state range's master, and low_params() every parameter cast.
  absl::Status InitCommon(const float* initial_params, std::initializer_list<NamedBuffer> more = {}) {
    using kernels::Buffer;
    if (low_) {
      ONEBIT_ASSIGN_OR_RETURN(p_, Buffer<float>::Create(backend_, state_alloc_));
      ONEBIT_RETURN_IF_ERROR(p_.CopyFromHostAt(0, initial_params + state_begin_, state_count_));
      // Cast on the host with the backends' own conversion (wire_dtype.h): the same bits.
      std::vector<uint16_t> low(params_alloc_, 0);
      for (size_t i = 0; i < n_; ++i) {
        low[i] = kernels::NarrowParam(options_.param_dtype, initial_params[i]);
      }
      ONEBIT_ASSIGN_OR_RETURN(p_low_, Buffer<uint16_t>::Create(backend_, params_alloc_));
      ONEBIT_RETURN_IF_ERROR(p_low_.CopyFromHostAt(0, low.data(), params_alloc_));
    } else {
      ONEBIT_ASSIGN_OR_RETURN(p_, Buffer<float>::Create(backend_, params_alloc_));
      ONEBIT_RETURN_IF_ERROR(p_.CopyFromHostAt(0, initial_params, n_));
    }
    for (Buffer<float>* b : {&m_, &v_}) {
      ONEBIT_ASSIGN_OR_RETURN(*b, Buffer<float>::Create(backend_, state_alloc_));
    }
    named_ = {{"params", &p_}, {"exp_avg", &m_}, {"exp_avg_sq", &v_}};
    owned_buffers_ = {&p_, &m_, &v_};
    for (const NamedBuffer& b : more) {
      ONEBIT_ASSIGN_OR_RETURN(*b.buffer, Buffer<float>::Create(backend_, state_alloc_));
      if (b.name != nullptr) named_.emplace_back(b.name, b.buffer);
      owned_buffers_.push_back(b.buffer);
    }
    std::vector<float> user_mask;
    if (!options_.momentum_mask.empty()) {
      const auto from = options_.momentum_mask.begin() + static_cast<std::ptrdiff_t>(state_begin_);
      user_mask.assign(from, from + static_cast<std::ptrdiff_t>(state_count_));
    }
    ONEBIT_ASSIGN_OR_RETURN(mask_, MomentumMask::Create(backend_, user_mask,
                                                      options_.auto_mask_zero_gradients,
                                                      state_count_));
    // Sharded, the compression step's clip scales the gradient inside the exchange
    // (AverageMomentumOfShard's g_scale, ShardRows' scale): no whole copy.
    ONEBIT_ASSIGN_OR_RETURN(clip_, GradientClipper::Create(backend_, options_.max_grad_norm, n_,
                                                           /*copy=*/!sharded_));
    return absl::OkStatus();
  }

  Options options_;
  kernels::Backend* backend_;
  Exchange* exchange_;
  std::unique_ptr<Exchange> owned_exchange_;  // set by a Create over a Transport
  size_t n_;
  size_t state_begin_ = 0;   // the state range (sharded: the shard's parameters)
  size_t state_count_;
  size_t state_alloc_ = 0;   // elements of m, v and the named buffers (n, or the stride)
  size_t params_alloc_ = 0;  // elements of p (n, or pieces x stride); low_: of p_low_
  bool sharded_ = false;
  bool low_ = false;         // sharded with low-precision parameters: p is the master shard
  size_t shard_piece_ = 0;   // sharded: this worker's slice of the padded parameters
  size_t shard_pieces_ = 1;  // sharded: the node's slices (its local workers)
  int64_t step_ = 0;
  kernels::Buffer<float> p_, m_, v_;
  kernels::Buffer<uint16_t> p_low_;  // low_: the model's parameters, pieces x stride
  MomentumMask mask_;
  GradientClipper clip_;
  std::vector<HyperGroup> hyper_groups_;  // options_.hyper_groups, resolved: at least one
  double exchange_call_seconds_ = 0.0;

 private:
  // Takes the exchange's state shard, if any, before Init allocates.
  absl::Status AdoptShard() {
    state_alloc_ = params_alloc_ = n_;
    const std::optional<StateShard> shard = exchange_->state_shard();
    if (!shard.has_value()) return absl::OkStatus();
    if (Derived::kCannotShard != nullptr) {
      return absl::InvalidArgumentError(Derived::kCannotShard);
    }
    if (shard->begin > shard->end || shard->end > n_ || shard->end - shard->begin > shard->stride ||
        shard->stride * static_cast<size_t>(shard->pieces) < n_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the exchange's state shard [", shard->begin, ", ", shard->end, ") of stride ",
          shard->stride, " x ", shard->pieces, " does not fit ", n_, " parameters"));
    }
    sharded_ = true;
    state_begin_ = shard->begin;
    state_count_ = shard->end - shard->begin;
    state_alloc_ = shard->stride;
    params_alloc_ = shard->stride * static_cast<size_t>(shard->pieces);
    shard_piece_ = static_cast<size_t>(shard->piece);
    shard_pieces_ = static_cast<size_t>(shard->pieces);
    low_ = options_.param_dtype != kernels::WireDtype::kFp32;
    return absl::OkStatus();
  }
  // Sharded: the node's workers must keep their parameters in one dtype, or their
  // all-gathers would move different sizes. One gather inside the node, at creation (a
  // collective of every local rank). FAILED_PRECONDITION naming the first that differs.
  absl::Status AgreeOnParamDtype() {
    if (!sharded_) return absl::OkStatus();
    const kernels::WireDtype mine = options_.param_dtype;
    ONEBIT_ASSIGN_OR_RETURN(const std::vector<double> all,
                            exchange_->GatherPartials({static_cast<double>(static_cast<int>(mine))}));
    for (size_t l = 0; l < all.size(); ++l) {
      if (all[l] == static_cast<double>(static_cast<int>(mine))) continue;
      const int theirs = static_cast<int>(all[l]);
      return absl::FailedPreconditionError(absl::StrCat(
          "local rank ", l, " keeps its parameters in ",
          theirs >= 0 && theirs <= 2 ? kernels::WireDtypeName(static_cast<kernels::WireDtype>(theirs))
                                     : "an unknown dtype",
          ", this worker in ", kernels::WireDtypeName(mine),
          ": with onebit.exchange.shard_state every worker of a node trains the same "
          "parameter dtype"));
    }
    return absl::OkStatus();
  }
  const Derived& derived() const { return static_cast<const Derived&>(*this); }
  Derived& derived() { return static_cast<Derived&>(*this); }

  std::vector<std::pair<std::string, kernels::Buffer<float>*>> named_;  // checkpoint names
  std::vector<const kernels::Buffer<float>*> owned_buffers_;  // InitCommon's, for state_bytes
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_OPTIM_OPTIMIZER_BASE_H_
