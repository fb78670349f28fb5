#include "worker/exchange/exchange.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compression/worker_compressor.h"

namespace onebit {

absl::StatusOr<ErrorState> Exchange::SaveErrors() {
  ErrorState state;
  ONEBIT_ASSIGN_OR_RETURN(state["worker_error"], worker_compressor().error().ToHost());
  return state;
}

absl::Status Exchange::RestoreErrors(const ErrorState& state) {
  ONEBIT_ASSIGN_OR_RETURN(const std::vector<float>* error, FindError(state, "worker_error"));
  return worker_compressor().RestoreError(*error);
}

absl::Status DecodeResult(const CompressedResult& r, kernels::Backend& backend, size_t n,
                          float* out) {
  if (r.codec == nullptr) {
    if (r.exact == nullptr) return absl::InternalError("an exchange result with no data");
    return backend.Copy(out, r.exact, n * sizeof(float));
  }
  return r.codec->Decode(backend, r.blocks, r.num_chunks, r.chunk, n, out);
}

absl::StatusOr<const std::vector<float>*> FindError(const ErrorState& state,
                                                    const std::string& name) {
  auto it = state.find(name);
  if (it == state.end()) {
    return absl::InvalidArgumentError(absl::StrCat("the checkpoint has no ", name));
  }
  return &it->second;
}

}  // namespace onebit
