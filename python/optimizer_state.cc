#include "python/optimizer_state.h"

#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/buffer.h"

namespace onebit {
namespace {

using Range = std::pair<size_t, size_t>;

std::string Text(const Range& r) { return absl::StrCat("[", r.first, ", ", r.second, ")"); }

// The parameters the tensors of `s` hold: its range scalars, or all n.
absl::StatusOr<Range> RangeOf(const OptimizerState& s, size_t n) {
  const auto begin = s.scalars.find(kStateBeginScalar);
  const auto end = s.scalars.find(kStateEndScalar);
  if (begin == s.scalars.end() && end == s.scalars.end()) return Range{0, n};
  if (begin == s.scalars.end() || end == s.scalars.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the state has one of ", kStateBeginScalar,
                                                   " and ", kStateEndScalar, " but not both"));
  }
  const double b = begin->second, e = end->second;
  if (!(b >= 0 && b <= e && e <= static_cast<double>(n)) || std::floor(b) != b ||
      std::floor(e) != e) {
    return absl::InvalidArgumentError(absl::StrCat("the state's range [", b, ", ", e,
                                                   ") is not one of a model of ", n,
                                                   " parameters"));
  }
  return Range{static_cast<size_t>(b), static_cast<size_t>(e)};
}

Range StateRange(const Optimizer& o) {
  return {o.state_begin(), o.state_begin() + o.state_count()};
}

absl::Status NotHeld(const std::string& name, const Range& asked, const Range& held) {
  return absl::InvalidArgumentError(absl::StrCat("optimizer state ", name, " ", Text(asked),
                                                 " is not held here: this worker holds ",
                                                 Text(held), " (sharded state)"));
}

}  // namespace

absl::StatusOr<OptimizerState> SaveOptimizerState(Optimizer& o) {
  OptimizerState state;
  state.step = o.step();
  state.freeze_step = o.freeze_step();
  const Range range = StateRange(o);
  for (const StateSpec& spec : o.CheckpointStates()) {
    ONEBIT_ASSIGN_OR_RETURN(std::vector<float> v,
                            o.StateToHost(spec.name, range.first, range.second));
    state.tensors.emplace_back(spec.name, std::move(v));
  }
  state.scalars = o.CheckpointScalars();
  if (o.exchange().state_shard().has_value()) {
    state.scalars[kStateBeginScalar] = static_cast<double>(range.first);
    state.scalars[kStateEndScalar] = static_cast<double>(range.second);
  }
  ONEBIT_ASSIGN_OR_RETURN(state.errors, o.exchange().SaveErrors());
  return state;
}

absl::StatusOr<OptimizerState> GatherOptimizerState(Optimizer& o, kernels::Backend& backend) {
  ONEBIT_ASSIGN_OR_RETURN(OptimizerState state, SaveOptimizerState(o));
  const std::optional<StateShard> shard = o.exchange().state_shard();
  if (!shard.has_value()) return state;
  const size_t n = o.size();
  const Range mine = StateRange(o);
  const size_t count = mine.second - mine.first;
  const size_t padded = static_cast<size_t>(shard->pieces) * shard->stride;
  if (count > shard->stride || padded < n) {
    return absl::InternalError(absl::StrCat("the state range ", Text(mine), " does not fit ",
                                            shard->pieces, " pieces of ", shard->stride));
  }
  // Checked before the first all-gather, so that no worker leaves the others waiting in one.
  for (const auto& [name, v] : state.tensors) {
    if (v.size() != count) {
      return absl::InternalError(absl::StrCat("the state's ", name, " has ", v.size(),
                                              " elements for ", Text(mine)));
    }
  }
  ONEBIT_ASSIGN_OR_RETURN(kernels::Buffer<float> whole,
                          kernels::Buffer<float>::Create(&backend, padded));
  // Every worker of the node goes through the same tensors in the same order
  // (CheckpointStates'), so the all-gathers pair up. The parameters too: a worker of a
  // low-precision model keeps its float32 masters of its range only.
  for (auto& [name, v] : state.tensors) {
    ONEBIT_RETURN_IF_ERROR(backend.Zero(whole.data(), padded * sizeof(float)));
    ONEBIT_RETURN_IF_ERROR(
        whole.CopyFromHostAt(static_cast<size_t>(shard->piece) * shard->stride, v.data(), count));
    ONEBIT_RETURN_IF_ERROR(o.exchange().AllGatherShards(whole.data()));
    ONEBIT_ASSIGN_OR_RETURN(v, whole.SliceToHost(0, n));
  }
  state.scalars.erase(kStateBeginScalar);
  state.scalars.erase(kStateEndScalar);
  return state;
}

absl::Status RestoreOptimizerState(Optimizer& o, const OptimizerState& s, bool keep_errors) {
  const size_t n = o.size();
  const Range whole{0, n};
  const Range mine = StateRange(o);
  ONEBIT_ASSIGN_OR_RETURN(const Range held, RangeOf(s, n));
  if (held != whole && held != mine) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the state holds parameters ", Text(held), " of ", n, "; this worker holds ", Text(mine),
        mine == whole ? ": load a whole state"
                      : " (sharded state): load a whole state or this worker's own"));
  }
  StateTensors tensors(s.tensors.begin(), s.tensors.end());
  const size_t count = held.second - held.first;
  for (const StateSpec& spec : o.CheckpointStates()) {
    auto it = tensors.find(spec.name);
    if (it == tensors.end() || it->second.size() != count) {
      return absl::InvalidArgumentError(
          absl::StrCat("the state's ", spec.name, " is missing or not ", count, " elements"));
    }
  }
  if (held != mine) {  // a whole state on a sharded worker: its range of each
    for (auto& [name, v] : tensors) {
      if (v.size() != n) continue;
      v = std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(mine.first),
                             v.begin() + static_cast<std::ptrdiff_t>(mine.second));
    }
  }
  if (keep_errors) {
    ONEBIT_ASSIGN_OR_RETURN(ErrorState current, o.exchange().SaveErrors());
    for (const auto& [name, v] : current) {
      auto it = s.errors.find(name);
      if (it == s.errors.end() || it->second.size() != v.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the state's ", name, " is missing or not ", v.size(), " elements"));
      }
    }
  }
  StateScalars scalars = s.scalars;
  scalars.erase(kStateBeginScalar);
  scalars.erase(kStateEndScalar);
  ONEBIT_RETURN_IF_ERROR(o.Restore(s.step, s.freeze_step, tensors, scalars));
  if (keep_errors) ONEBIT_RETURN_IF_ERROR(o.exchange().RestoreErrors(s.errors));
  return absl::OkStatus();
}

absl::StatusOr<NamedTensors> StateSlice(Optimizer& o, size_t begin, size_t end) {
  NamedTensors out;
  for (const StateSpec& spec : o.CheckpointStates()) {
    if (spec.name == "params") continue;
    if (begin == end) {
      out.emplace_back(spec.name, std::vector<float>());
      continue;
    }
    ONEBIT_ASSIGN_OR_RETURN(std::vector<float> v, o.StateToHost(spec.name, begin, end));
    out.emplace_back(spec.name, std::move(v));
  }
  return out;
}

absl::StatusOr<NamedTensors> StateSlice(const OptimizerState& s, size_t n, size_t begin,
                                        size_t end) {
  ONEBIT_ASSIGN_OR_RETURN(const Range held, RangeOf(s, n));
  NamedTensors out;
  for (const auto& [name, v] : s.tensors) {
    if (name == "params") continue;
    if (begin == end) {
      out.emplace_back(name, std::vector<float>());
      continue;
    }
    if (begin < held.first || end > held.second) return NotHeld(name, {begin, end}, held);
    if (v.size() != held.second - held.first) {
      return absl::InternalError(absl::StrCat("the state's ", name, " has ", v.size(),
                                              " elements for ", Text(held)));
    }
    out.emplace_back(name, std::vector<float>(v.begin() + (begin - held.first),
                                              v.begin() + (end - held.first)));
  }
  return out;
}

}  // namespace onebit
