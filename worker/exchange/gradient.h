// A worker's local gradient as its workload wrote it (backend memory, n elements): float32,
// or bfloat16 where the model's parameters are bfloat16 and the worker keeps its gradient
// buffer at 2 bytes an element (sharded state: docs/design.md "Sharded optimizer state").
//
// The readers of a 16-bit gradient widen it, and widening bf16 or fp16 to float32 is exact
// (wire_dtype.h). So a 16-bit gradient gives the bits its float32 copy gives, and nothing
// makes that copy: the exchange widens segment by segment as it sends
// (HierarchicalExchange), and Backend::SumSquaresWire measures it in place.
//
// Only the sharded calls read 16-bit gradients (Exchange's ...OfShard and ShardRows); the
// others take `fp32()`, and an optimizer given a 16-bit gradient where it has no sharded
// path says so (OptimizerBase::CheckGradient).
#ifndef ONEBIT_WORKER_EXCHANGE_GRADIENT_H_
#define ONEBIT_WORKER_EXCHANGE_GRADIENT_H_

#include <cstddef>

#include "kernels/wire_dtype.h"

namespace onebit {

struct Gradient {
  Gradient() = default;
  // A float32 gradient: implicit, so that the float32 callers pass their pointer as before.
  Gradient(const float* fp32) : data(fp32) {}  // NOLINT(runtime/explicit)
  Gradient(const void* data, kernels::WireDtype dtype) : data(data), dtype(dtype) {}

  bool is_fp32() const { return dtype == kernels::WireDtype::kFp32; }
  // The float32 elements; null for a 16-bit gradient.
  const float* fp32() const {
    return is_fp32() ? static_cast<const float*>(data) : nullptr;
  }
  // The gradient from element i on (the same dtype).
  Gradient From(size_t i) const {
    return Gradient(static_cast<const char*>(data) + i * kernels::WireDtypeBytes(dtype), dtype);
  }

  const void* data = nullptr;
  kernels::WireDtype dtype = kernels::WireDtype::kFp32;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_EXCHANGE_GRADIENT_H_
