// server/shard_state.h on a stream of pushes with arbitrary (worker, step, chunk, kind,
// payload) on the CPU backend: what a parameter-server shard does with every Push message
// that reaches it over the network. Each input is a fresh shard and a sequence of calls.
//
// Whatever the pushes, a result the shard hands out must be one a worker accepts (the
// checks of worker/exchange/ps_exchange.cc ValidateResult): the payload size of its kind
// and, for a compressed block, a finite scale >= 0 (and with int8 a finite offset).
//
// Input: a 6-byte header (u8 workers-1, u8 shards-1, u8 shard, u16 n-1, u8 flags: bit 0
// AVX2, bit 6 the int8 compressor, bit 7 checkpoints, (flags >> 1) % 3 retained steps), then
// operations: u8 worker, u8 step code (0x7f: an int64 step follows; else the current step
// plus -2..2), u8 chunk, u8 kind, u8 op (bit 0 checkpoint flag, bit 1 a u16 payload length
// follows, bit 2 ask for the result instead of pushing, bit 3 restore the server error from
// the payload, bit 4 push it as a Cord in pieces of 1 + (op >> 5) bytes or more: PushCord, as the
// gRPC service does), then the payload. Bytes past the end of the input read as zero. Values with
// the top bit set are used raw (negative workers, wrong chunks, unknown kinds).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/time/time.h"
#include "compression/layout.h"
#include "fuzz/fuzz_support.h"
#include "kernels/kernels.h"
#include "server/shard_state.h"

namespace onebit::server {
namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  template <typename T>
  T Get() {
    T v{};
    uint8_t bytes[sizeof(T)] = {};
    for (uint8_t& b : bytes) b = Byte();
    std::memcpy(&v, bytes, sizeof(T));
    return v;
  }
  std::string Bytes(size_t count) {
    std::string out(count, '\0');
    const size_t take = std::min(count, size_ - std::min(pos_, size_));
    if (take > 0) std::memcpy(out.data(), data_ + pos_, take);
    pos_ += take;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

kernels::Backend* Backend(bool simd) {
  static kernels::Backend* with = kernels::NewCpuBackend(true).release();
  static kernels::Backend* without = kernels::NewCpuBackend(false).release();
  return simd ? with : without;
}

class Observer : public ShardObserver {
 public:
  void OnServerErrorNorm(double norm) override { last_norm = norm; }
  double last_norm = 0.0;
};

void CheckResult(const PsLayout& layout, int shard, ChunkKind kind, const ResultPayload& result) {
  if (result == nullptr) return;
  ONEBIT_FUZZ_CHECK(result->size() == layout.payload_bytes(kind, shard));
  if (kind == ChunkKind::kOnebit) {
    const std::optional<HeaderFault> fault =
        layout.codec().CheckHeader(reinterpret_cast<const uint8_t*>(result->data()));
    if (fault.has_value()) {
      std::fprintf(stderr, "fuzz: the shard answered a %s result with %s %g\n",
                   std::string(layout.codec().name()).c_str(),
                   std::string(fault->field).c_str(), fault->value);
    }
    ONEBIT_FUZZ_CHECK(!fault.has_value());
  }
}

void Run(const uint8_t* data, size_t size) {
  Input in(data, size);
  ShardConfig config;
  config.num_workers = 1 + in.Byte() % 4;
  config.num_shards = 1 + in.Byte() % 4;
  config.shard = in.Byte() % config.num_shards;
  config.n = 1 + in.Get<uint16_t>() % 512;
  const uint8_t flags = in.Byte();
  config.retained_steps = 2 + (flags >> 1) % 3;
  if (flags & 0x40) config.codec = &Int8Codec();
  int checkpoints = 0;
  if (flags & 0x80) {
    config.on_checkpoint = [&checkpoints](int64_t, std::vector<float>) { ++checkpoints; };
  }
  Observer observer;
  absl::StatusOr<std::unique_ptr<ShardState>> created =
      ShardState::Create(Backend(flags & 1), config, &observer);
  ONEBIT_FUZZ_CHECK(created.ok());
  ShardState& state = **created;
  const PsLayout& layout = state.layout();

  int64_t base = 1;
  for (int ops = 0; !in.empty() && ops < 64; ++ops) {
    const uint8_t worker_byte = in.Byte();
    const int worker = (worker_byte & 0x80) ? static_cast<int8_t>(worker_byte)
                                            : worker_byte % config.num_workers;
    const uint8_t step_byte = in.Byte();
    const int64_t step =
        step_byte == 0x7f ? in.Get<int64_t>() : base + static_cast<int8_t>(step_byte) % 3;
    const uint8_t chunk_byte = in.Byte();
    const int chunk = (chunk_byte & 0x80) ? static_cast<int8_t>(chunk_byte) : config.shard;
    const uint8_t kind_byte = in.Byte();
    const ChunkKind kind = (kind_byte & 0x80) ? static_cast<ChunkKind>(static_cast<int8_t>(kind_byte))
                                              : static_cast<ChunkKind>(1 + kind_byte % 2);
    const uint8_t op = in.Byte();
    if (op & 4) {  // a worker asking for a result; never waits
      absl::StatusOr<ResultPayload> result =
          state.AwaitResult(worker, step, chunk, kind, absl::InfinitePast());
      fuzz::Say("AwaitResult", result.status());
      if (result.ok()) CheckResult(layout, config.shard, kind, *result);
      continue;
    }
    // The payload: as long as the kind wants, or (op bit 1) of a length that follows.
    size_t length = layout.payload_bytes(kind, config.shard);
    if (op & 2) length = in.Get<uint16_t>();
    const std::string payload = in.Bytes(length);
    if (op & 8) {  // a resume: the server error from the payload's floats
      std::vector<float> error(payload.size() / sizeof(float));
      if (!error.empty()) std::memcpy(error.data(), payload.data(), error.size() * sizeof(float));
      fuzz::Say("RestoreServerError", state.RestoreServerError(error));
      continue;
    }
    absl::StatusOr<ShardState::PushOutcome> outcome;
    if (op & 16) {  // as the gRPC service pushes: a Cord in pieces of 1..8 bytes
      absl::Cord cord;
      // At most ~256 pieces, so that the Cord's nodes stay within the heap budget.
      const size_t piece = std::max<size_t>(1 + (op >> 5), payload.size() / 256 + 1);
      for (size_t at = 0; at < payload.size(); at += piece) {
        auto* bytes = new std::string(payload.substr(at, piece));
        cord.Append(absl::MakeCordFromExternal(*bytes, [bytes] { delete bytes; }));
      }
      outcome = state.PushCord(worker, step, chunk, kind, std::move(cord), (op & 1) != 0);
    } else {
      outcome = state.Push(worker, step, chunk, kind, payload, (op & 1) != 0);
    }
    if (fuzz::Verbose()) {
      std::fprintf(stderr, "fuzz: Push(worker %d, step %lld, chunk %d, kind %d, %zu bytes): %s%s\n",
                   worker, static_cast<long long>(step), chunk, static_cast<int>(kind),
                   payload.size(), outcome.status().ToString().c_str(),
                   outcome.ok() && outcome->result != nullptr ? " (result)" : "");
    }
    if (!outcome.ok()) {
      ONEBIT_FUZZ_CHECK(!outcome.status().message().empty());
      continue;
    }
    base = step;
    CheckResult(layout, config.shard, kind, outcome->result);
  }
  (void)state.ServerErrorNorm();
  (void)state.ServerErrorToHost();
  state.Shutdown();
  ONEBIT_FUZZ_CHECK(!state.Push(0, base, config.shard, ChunkKind::kFp32, "").ok());
}

}  // namespace
}  // namespace onebit::server

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  (void)onebit::server::Backend(true);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);
  onebit::server::Run(data, size);
  // The shard's buffers are bounded by the header (n <= 512, W <= 4, 4 retained steps);
  // payloads are copies of the input.
  onebit::fuzz::HeapBudget::End(size, 4, 256 << 10);
  return 0;
}
