#include "worker/optim/optimizer.h"

#include "absl/strings/str_cat.h"

namespace onebit {

const char* StageName(Stage stage) {
  return stage == Stage::kWarmup ? "warmup" : "compression";
}

absl::StatusOr<const std::vector<float>*> FindState(const StateTensors& states,
                                                    const std::string& name, size_t n) {
  const auto it = states.find(name);
  if (it == states.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint has no ", name));
  }
  if (it->second.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has ", it->second.size(), " elements, the model ", n));
  }
  return &it->second;
}

}  // namespace onebit
