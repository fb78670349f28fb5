#include "worker/exchange/exchange.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

namespace {

absl::Status NotSharded(absl::string_view call) {
  return absl::UnimplementedError(absl::StrCat(
      call, ": this exchange keeps no sharded optimizer state (only a hierarchical exchange "
            "built with shard_state does)"));
}

}  // namespace

absl::StatusOr<const float*> Exchange::SumGradientsOfShard(int64_t, Gradient) {
  return NotSharded("SumGradientsOfShard");
}

absl::StatusOr<CompressedResult> Exchange::AverageMomentumOfShard(int64_t, const float*,
                                                                  Gradient, float, float) {
  return NotSharded("AverageMomentumOfShard");
}

absl::StatusOr<float*> Exchange::ShardRows(int64_t, Gradient, float) {
  return NotSharded("ShardRows");
}

absl::StatusOr<CompressedResult> Exchange::CompressedAverageOfRows(int64_t) {
  return NotSharded("CompressedAverageOfRows");
}

absl::Status Exchange::AllGatherShards(float*) { return NotSharded("AllGatherShards"); }

absl::Status Exchange::AllGatherShardBytes(void*, size_t) {
  return NotSharded("AllGatherShardBytes");
}

absl::StatusOr<std::vector<double>> Exchange::GatherPartials(const std::vector<double>&) {
  return NotSharded("GatherPartials");
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
