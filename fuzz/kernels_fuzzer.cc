// kernels/kernels.h on compressed blocks whose bytes, scales included, are arbitrary (NaN,
// infinities, negative, subnormal): Decompress, DecompressFrozenAdamUpdate (what a worker
// runs on the result blocks it gets) and ServerAggregate (what a server runs on the workers'
// blocks), on the CPU backend, AVX2 and scalar.
//
// The decoders must also agree: Decompress and DecompressFrozenAdamUpdate give the same
// bits on both paths (kernels.h), NaN for NaN. Sizes the backend refuses (a chunk that is
// not a multiple of 8, n beyond the blocks) must be refused by both.
//
// With the int8 compressor (bit 7 of the workers byte) the same for DecompressInt8 and
// ServerAggregateInt8 on arbitrary int8 blocks, and CompressWorkerInt8 of the arbitrary m
// values (NaN and infinities included: no float->int conversion of them, same bytes on
// both paths; a non-finite chunk decodes to NaN).
//
// Input: u8 num_chunks-1 (mod 4), u8 chunk code (top bit clear: 8 * (code + 1) elements;
// set: the low bits as they are, often not a multiple of 8), u16 n (top bit set: beyond the
// blocks), u8 workers-1 (mod 4; bit 7: int8), then the blocks (num_chunks * (4 + chunk/8)
// bytes, int8: num_chunks * (8 + chunk); missing bytes are zero), then v, m, p and mask
// values (floats; missing values are fixed ones).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kernels/kernels.h"

namespace onebit::kernels {
namespace {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // `count` bytes, zeros past the end of the input.
  std::vector<uint8_t> Bytes(size_t count) {
    std::vector<uint8_t> out(count, 0);
    const size_t take = std::min(count, size_ - std::min(pos_, size_));
    if (take > 0) std::memcpy(out.data(), data_ + pos_, take);
    pos_ += take;
    return out;
  }
  float Float(float fallback) {
    if (size_ - std::min(pos_, size_) < sizeof(float)) return fallback;
    float f;
    std::memcpy(&f, data_ + pos_, sizeof(f));
    pos_ += sizeof(f);
    return f;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

bool SameFloats(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

Backend* Simd() {
  static Backend* b = NewCpuBackend(/*allow_simd=*/true).release();
  return b;
}
Backend* Scalar() {
  static Backend* b = NewCpuBackend(/*allow_simd=*/false).release();
  return b;
}

bool SameBytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { return a == b; }

void RunInt8(Input& in, const uint8_t* data, size_t num_chunks, size_t chunk, size_t n,
             int workers) {
  const size_t total = num_chunks * chunk;
  const size_t block = Int8BlockBytes(chunk);
  const std::vector<uint8_t> blocks = in.Bytes(num_chunks * block);
  std::vector<float> m0(n);
  for (float& x : m0) x = in.Float(0.5f);
  const bool fused = (data[0] & 0x80) != 0;

  // DecompressInt8.
  std::vector<float> out_simd(n), out_scalar(n);
  const absl::Status d1 =
      Simd()->DecompressInt8(blocks.data(), num_chunks, chunk, n, out_simd.data());
  const absl::Status d2 =
      Scalar()->DecompressInt8(blocks.data(), num_chunks, chunk, n, out_scalar.data());
  fuzz::Say("DecompressInt8", d1);
  ONEBIT_FUZZ_CHECK(d1.ok() == d2.ok());
  if (d1.ok()) ONEBIT_FUZZ_CHECK(SameFloats(out_simd, out_scalar));
  ONEBIT_FUZZ_CHECK(d1.ok() == (chunk % 8 == 0 && n <= total));
  if (chunk % 8 != 0 || n > total) return;

  // CompressWorkerInt8 of m0 (and m0 as the gradient when fused), error from zero; twice, so
  // the second starts from whatever error the first left.
  std::vector<uint8_t> compressed[2];
  std::vector<float> err[2];
  Backend* backends[2] = {Simd(), Scalar()};
  for (int b = 0; b < 2; ++b) {
    err[b].assign(total, 0.0f);
    compressed[b].assign(num_chunks * block, 0);
    for (int step = 0; step < 2; ++step) {
      ONEBIT_FUZZ_CHECK(backends[b]
                            ->CompressWorkerInt8(m0.data(), fused ? m0.data() : nullptr, 0.9f, n,
                                                 num_chunks, chunk, err[b].data(),
                                                 compressed[b].data())
                            .ok());
    }
  }
  ONEBIT_FUZZ_CHECK(SameBytes(compressed[0], compressed[1]));
  ONEBIT_FUZZ_CHECK(SameFloats(err[0], err[1]));
  // A chunk with a value that is not finite decodes to NaN.
  std::vector<float> decoded(total);
  ONEBIT_FUZZ_CHECK(
      Simd()->DecompressInt8(compressed[0].data(), num_chunks, chunk, total, decoded.data()).ok());
  for (size_t r = 0; r < num_chunks && chunk > 0; ++r) {
    float scale;
    std::memcpy(&scale, compressed[0].data() + r * block, sizeof(scale));
    if (!std::isfinite(scale)) {
      for (size_t j = 0; j < chunk; ++j) ONEBIT_FUZZ_CHECK(std::isnan(decoded[r * chunk + j]));
    }
  }

  // ServerAggregateInt8: the first `workers` arbitrary blocks, repeated as needed.
  std::vector<uint8_t> worker_blocks(static_cast<size_t>(workers) * block);
  for (int w = 0; w < workers; ++w) {
    std::memcpy(worker_blocks.data() + w * block, blocks.data() + (w % num_chunks) * block, block);
  }
  std::vector<uint8_t> results[2];
  std::vector<float> server_err[2];
  for (int b = 0; b < 2; ++b) {
    server_err[b].assign(chunk, 0.0f);
    for (size_t i = 0; i < chunk && i < n; ++i) server_err[b][i] = m0[i];
    results[b].assign(block, 0);
    ONEBIT_FUZZ_CHECK(backends[b]
                          ->ServerAggregateInt8(worker_blocks.data(), workers, chunk,
                                                server_err[b].data(), results[b].data())
                          .ok());
  }
  ONEBIT_FUZZ_CHECK(SameBytes(results[0], results[1]));
  ONEBIT_FUZZ_CHECK(SameFloats(server_err[0], server_err[1]));
}

void Run(const uint8_t* data, size_t size) {
  Input in(data, size);
  const size_t num_chunks = 1 + in.Byte() % 4;
  const uint8_t chunk_byte = in.Byte();
  // Mostly valid chunks (multiples of 8 up to 2048 elements), sometimes any value.
  const size_t chunk = (chunk_byte & 0x80) ? (chunk_byte & 0x7f) : 8 * (chunk_byte & 0x7f) + 8;
  const size_t total = num_chunks * chunk;
  size_t n = in.Byte();
  n |= static_cast<size_t>(in.Byte()) << 8;
  // Mostly n <= total, sometimes beyond (the backend must refuse).
  n = (n & 0x8000) ? total + 1 + (n & 0xff) : n % (total + 1);
  const uint8_t workers_byte = in.Byte();
  const int workers = 1 + (workers_byte & 0x7f) % 4;
  if (workers_byte & 0x80) return RunInt8(in, data, num_chunks, chunk, n, workers);
  const size_t block = CompressedBlockBytes(chunk);
  const std::vector<uint8_t> blocks = in.Bytes(num_chunks * block);
  // Exactly the n elements the API promises to touch, so that ASan sees any write beyond.
  std::vector<float> v(n), m0(n), p0(n), mask(n);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = in.Float(1e-4f);
    m0[i] = in.Float(0.5f);
    p0[i] = in.Float(1.0f);
    mask[i] = (in.Byte() & 1) ? 1.0f : 0.0f;
  }
  const bool use_mask = (data[0] & 0x80) != 0;  // size >= 1 here (num_chunks read data[0])
  AdamHyper hyper;

  // Decompress.
  std::vector<float> out_simd(v.size()), out_scalar(v.size());
  const absl::Status d1 = Simd()->Decompress(blocks.data(), num_chunks, chunk, n, out_simd.data());
  const absl::Status d2 =
      Scalar()->Decompress(blocks.data(), num_chunks, chunk, n, out_scalar.data());
  fuzz::Say("Decompress", d1);
  ONEBIT_FUZZ_CHECK(d1.ok() == d2.ok());
  if (d1.ok()) ONEBIT_FUZZ_CHECK(SameFloats(out_simd, out_scalar));
  ONEBIT_FUZZ_CHECK(d1.ok() == (chunk % 8 == 0 && n <= total));

  // DecompressFrozenAdamUpdate.
  std::vector<float> m1 = m0, p1 = p0, m2 = m0, p2 = p0;
  const float* mask_ptr = use_mask ? mask.data() : nullptr;
  const absl::Status f1 = Simd()->DecompressFrozenAdamUpdate(
      blocks.data(), num_chunks, chunk, hyper, v.data(), mask_ptr, m1.data(), p1.data(), n);
  const absl::Status f2 = Scalar()->DecompressFrozenAdamUpdate(
      blocks.data(), num_chunks, chunk, hyper, v.data(), mask_ptr, m2.data(), p2.data(), n);
  ONEBIT_FUZZ_CHECK(f1.ok() == f2.ok());
  if (f1.ok()) {
    ONEBIT_FUZZ_CHECK(SameFloats(m1, m2));
    ONEBIT_FUZZ_CHECK(SameFloats(p1, p2));
  }

  // ServerAggregate: the first `workers` blocks of `chunk` elements, repeated as needed.
  if (chunk % 8 == 0) {
    std::vector<uint8_t> worker_blocks(static_cast<size_t>(workers) * block);
    for (int w = 0; w < workers; ++w) {
      std::memcpy(worker_blocks.data() + w * block, blocks.data() + (w % num_chunks) * block,
                  block);
    }
    for (Backend* backend : {Simd(), Scalar()}) {
      std::vector<float> err(chunk);
      for (size_t i = 0; i < chunk && i < n; ++i) err[i] = m0[i];
      std::vector<uint8_t> result(block);
      ONEBIT_FUZZ_CHECK(
          backend->ServerAggregate(worker_blocks.data(), workers, chunk, err.data(), result.data())
              .ok());
    }
  }
}

}  // namespace
}  // namespace onebit::kernels

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  (void)onebit::kernels::Simd();
  (void)onebit::kernels::Scalar();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);
  onebit::kernels::Run(data, size);
  // A dozen buffers of at most 4 chunks of 1024 elements, whatever the input.
  onebit::fuzz::HeapBudget::End(0, 0, 1 << 20);
  return 0;
}
