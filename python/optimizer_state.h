// An optimizer's state as the embedded worker (embedded.h) hands it to a script and takes
// it back: host copies of its tensors, scalars and error buffers, by name.
//
// SHARDED STATE (Exchange::state_shard): a sharded worker holds m, v and the other shared
// tensors of its state range only, [state_begin, state_begin + state_count). Its state
// then holds every tensor (p too) over that range, and the scalars kStateBeginScalar and
// kStateEndScalar say which; an unsharded worker's state is whole and has neither. Both
// are plain scalars, so a state keeps them through the C interface and Python.
//
// Thread safety: free functions over an Optimizer, which is one thread's at a time.
#ifndef ONEBIT_PYTHON_OPTIMIZER_STATE_H_
#define ONEBIT_PYTHON_OPTIMIZER_STATE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kernels.h"
#include "worker/exchange/exchange.h"
#include "worker/optim/optimizer.h"

namespace onebit {

using NamedTensors = std::vector<std::pair<std::string, std::vector<float>>>;

// An optimizer's state between two steps, as state_dict() hands it to a script.
struct OptimizerState {
  int64_t step = 0;
  int64_t freeze_step = -1;
  int rank = -1;  // the rank and world size that saved it (-1: not said)
  int world_size = -1;
  NamedTensors tensors;  // the optimizer's state tensors (parameters included)
  StateScalars scalars;  // its scalars (and a sharded state's range)
  ErrorState errors;     // this worker's error buffers
  StateScalars trainer;  // the trainer's scalars (the loss scaler)
};

// The parameters a sharded state's tensors hold: [scalars[kStateBeginScalar],
// scalars[kStateEndScalar]).
inline constexpr char kStateBeginScalar[] = "state_begin";
inline constexpr char kStateEndScalar[] = "state_end";

// `o`'s state between two steps (all but the trainer's scalars): every tensor over its
// state range.
absl::StatusOr<OptimizerState> SaveOptimizerState(Optimizer& o);

// `o`'s whole state between two steps (all but the trainer's scalars): a sharded worker
// all-gathers each tensor inside its node (Exchange::AllGatherShards, through a staging
// buffer of pieces x stride floats in `backend`'s memory), a collective of the node's
// workers: every local worker calls it at the same point. The result has no range scalars
// and loads into a sharded or an unsharded worker; its error buffers are this worker's. An
// unsharded worker's is SaveOptimizerState's.
absl::StatusOr<OptimizerState> GatherOptimizerState(Optimizer& o, kernels::Backend& backend);

// Puts `s` into `o` (all but the trainer's scalars); everything is checked before anything
// changes. `s` is whole (n elements a tensor; a sharded worker takes its range of each) or
// exactly `o`'s state range; anything else is INVALID_ARGUMENT naming both ranges. With
// keep_errors false the error buffers stay as they are. A sharded optimizer's Restore
// all-gathers p inside the node: every local worker puts a state back at the same point.
absl::Status RestoreOptimizerState(Optimizer& o, const OptimizerState& s, bool keep_errors);

// Elements [begin, end) of each of the tensors of `o` but the parameters: a sharded worker
// has them within its state range only (INVALID_ARGUMENT naming that range for others);
// an empty range is empty everywhere.
absl::StatusOr<NamedTensors> StateSlice(Optimizer& o, size_t begin, size_t end);
// The same of a saved state `s` of a model of n parameters.
absl::StatusOr<NamedTensors> StateSlice(const OptimizerState& s, size_t n, size_t begin,
                                        size_t end);

}  // namespace onebit

#endif  // ONEBIT_PYTHON_OPTIMIZER_STATE_H_
