// The optimizer types a job config names, and what the rest of the system needs to know
// about each one. The coordinator, the shards and the launcher ask these traits; only the
// worker's optimizer factory builds one (worker/optim/optimizer_factory.h). Adding an
// optimizer adds a row here and a builder there.
//
// Thread safety: everything here is immutable.
#ifndef ONEBIT_CONFIG_OPTIMIZER_KIND_H_
#define ONEBIT_CONFIG_OPTIMIZER_KIND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace onebit {

enum class OptimizerKind { kOneBitAdam, kZeroOneAdam, kOneBitLamb, kAdam };

struct OptimizerTraits {
  OptimizerKind kind;
  // The config's spelling: JSON, checkpoint manifests and messages.
  const char* name;
  // How a person reads it: "1-bit Adam", "0/1 Adam".
  const char* display_name;
  // Whether it ever switches to compression. False: Adam, which never freezes.
  bool compresses;
  // Whether some steps after the warmup send nothing (0/1 Adam's local steps): leases carry
  // the steps that communicate, and the shards accept gaps in step numbers.
  bool has_local_steps;
  // Whether it switches from full precision to compression once and stays there. Only
  // such an optimizer may run its warmup between the workers over ps.
  bool one_switch;
  // The optimizer.params key that holds the last warmup step.
  const char* warmup_end_key;
  // The optimizer.params keys it takes beyond the ones every type takes.
  std::vector<std::string> own_keys;
};

// Every kind, in declaration order.
const std::vector<OptimizerTraits>& AllOptimizerTraits();
const OptimizerTraits& Traits(OptimizerKind kind);

// The kind a config names, in any case; "AdamW" is Adam. INVALID_ARGUMENT otherwise (the
// caller words the error).
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);

}  // namespace onebit

#endif  // ONEBIT_CONFIG_OPTIMIZER_KIND_H_
