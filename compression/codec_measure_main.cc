// Every registered codec on one tensor, in one run (BENCHMARKS.md, "fp8 compressor"):
//   - bytes: the block of the peer layout's chunk C for W workers, per element, and what a
//     worker sends per step in peer mode, 2(W-1) blocks;
//   - fidelity: ||decode(compress(x)) - x|| / ||x|| with a zero error (no error feedback),
//     on gaussian data, on Student-t data with 3 degrees of freedom (heavy tails), and on
//     a float32 .npy tensor (--npy) or a tensor of a job's checkpoint (--part, the workers'
//     parts, and --tensor: "exp_avg" is the momentum);
//   - time: the worker's compression of the whole tensor (W chunks) and the server's
//     aggregation of one chunk of the tensor's length from W workers, on the CPU backend
//     with one thread: CPU time of the calling thread and wall time, medians.
//
//   bazel run -c opt //compression:codec_measure -- --n=16777216 --workers=4
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "checkpoint/part.h"
#include "common/npy.h"
#include "compression/codec.h"
#include "compression/codec_registry.h"
#include "compression/layout.h"
#include "kernels/kernels.h"

ABSL_FLAG(int64_t, n, 1 << 24, "Elements of the tensor.");
ABSL_FLAG(int, workers, 4, "Workers W: the peer layout's chunks, and the server's rows.");
ABSL_FLAG(int, reps, 5, "Timed repetitions (the median is printed); 0: no timing.");
ABSL_FLAG(std::string, npy, "", "A float32 .npy tensor to measure the fidelity on too.");
ABSL_FLAG(std::string, part, "",
          "Checkpoint parts (checkpoint/part.h), comma-separated in rank order: their slices "
          "of --tensor, joined, are a tensor to measure the fidelity on too.");
ABSL_FLAG(std::string, tensor, "exp_avg", "The tensor of --part.");
ABSL_FLAG(int, seed, 1, "Random seed.");

namespace onebit {
namespace {

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ||decode(compress(x)) - x|| / ||x||, the worker error zero, in the peer layout.
double RelativeError(const Codec& codec, kernels::Backend& backend, const std::vector<float>& x,
                     int w) {
  const size_t n = x.size(), n_pad = PeerPaddedSize(n, w), chunk = n_pad / w;
  std::vector<float> err(n_pad, 0.0f), dec(n);
  std::vector<uint8_t> blocks(w * codec.BlockBytes(chunk));
  if (!codec.Compress(backend, x.data(), nullptr, 0.0f, n, w, chunk, err.data(), blocks.data())
           .ok() ||
      !codec.Decode(backend, blocks.data(), w, chunk, n, dec.data()).ok()) {
    std::fprintf(stderr, "error: %s failed\n", std::string(codec.name()).c_str());
    std::exit(1);
  }
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(dec[i]) - x[i];
    num += d * d;
    den += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

struct Timing {
  double cpu = 0.0, wall = 0.0;
};

template <typename F>
Timing Time(int reps, F&& f) {
  std::vector<double> cpu, wall;
  f();  // warm: pages touched, caches filled
  for (int r = 0; r < reps; ++r) {
    const double c0 = ThreadSeconds(), w0 = WallSeconds();
    f();
    cpu.push_back(ThreadSeconds() - c0);
    wall.push_back(WallSeconds() - w0);
  }
  return {Median(cpu), Median(wall)};
}

int Main() {
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_n));
  const int w = absl::GetFlag(FLAGS_workers), reps = absl::GetFlag(FLAGS_reps);
  if (n == 0 || w < 1) {
    std::fprintf(stderr, "error: need --n >= 1 and --workers >= 1\n");
    return 2;
  }
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::student_t_distribution<float> t3(3.0f);
    std::vector<float> g(n), t(n);
    for (float& v : g) v = normal(rng);
    for (float& v : t) v = t3(rng);
    tensors.emplace_back("gaussian", std::move(g));
    tensors.emplace_back("student-t, 3 dof", std::move(t));
  }
  if (const std::string path = absl::GetFlag(FLAGS_npy); !path.empty()) {
    absl::StatusOr<npy::Float32Array> a = npy::ReadFloat32(path);
    if (!a.ok()) {
      std::fprintf(stderr, "error: %s\n", std::string(a.status().message()).c_str());
      return 1;
    }
    tensors.emplace_back(path, std::move(a->data));
  }
  if (const std::string paths = absl::GetFlag(FLAGS_part); !paths.empty()) {
    // The workers' parts in rank order: their slices, one after the other, are the tensor.
    const std::string name = absl::GetFlag(FLAGS_tensor);
    std::vector<float> whole;
    for (const absl::string_view path : absl::StrSplit(paths, ',')) {
      absl::StatusOr<checkpoint::Part> part = checkpoint::ReadPart(std::string(path));
      absl::StatusOr<const checkpoint::Tensor*> t =
          part.ok() ? part->Get(name) : absl::StatusOr<const checkpoint::Tensor*>(part.status());
      absl::StatusOr<int64_t> begin =
          part.ok() ? part->MetaInt("slice_begin") : absl::StatusOr<int64_t>(part.status());
      if (!t.ok() || !begin.ok()) {
        std::fprintf(stderr, "error: %s\n",
                     std::string((t.ok() ? begin.status() : t.status()).message()).c_str());
        return 1;
      }
      if (static_cast<size_t>(*begin) != whole.size()) {
        std::fprintf(stderr, "error: %s starts at element %lld, not %zu: give the parts in "
                     "rank order\n", std::string(path).c_str(), static_cast<long long>(*begin),
                     whole.size());
        return 1;
      }
      whole.insert(whole.end(), (*t)->data.begin(), (*t)->data.end());
    }
    tensors.emplace_back(name + " of the parts", std::move(whole));
  }
  std::unique_ptr<kernels::Backend> backend = kernels::NewCpuBackend(true, 1);
  const size_t n_pad = PeerPaddedSize(n, w), chunk = n_pad / w;
  std::printf("n = %zu, W = %d, peer chunk C = %zu, backend %s\n\n", n, w, chunk,
              backend->name().c_str());

  std::printf("%-8s %14s %16s %22s\n", "codec", "block bytes", "bytes/element",
              "sent/worker/step (B)");
  for (const Codec* codec : AllCodecs()) {
    const size_t block = codec->BlockBytes(chunk);
    std::printf("%-8s %14zu %16.5f %22zu\n", std::string(codec->name()).c_str(), block,
                static_cast<double>(block) / static_cast<double>(chunk),
                static_cast<size_t>(2 * (w - 1)) * block);
  }

  std::printf("\nrelative L2 error of one compression, no error feedback, W = %d chunks\n", w);
  for (const auto& [name, x] : tensors) std::printf("  %s: %zu elements\n", name.c_str(), x.size());
  std::printf("%-8s", "codec");
  for (const auto& [name, x] : tensors) std::printf(" %24s", name.c_str());
  std::printf("\n");
  for (const Codec* codec : AllCodecs()) {
    std::printf("%-8s", std::string(codec->name()).c_str());
    for (const auto& [name, x] : tensors) {
      std::printf(" %24.6f", RelativeError(*codec, *backend, x, w));
    }
    std::printf("\n");
  }
  if (reps <= 0) return 0;

  // Timing on the gaussian tensor: the worker's whole tensor as W chunks, and one server
  // chunk of n elements from W workers (each row the tensor compressed as one chunk).
  std::printf("\nmedian of %d, one thread: CPU ms / wall ms\n", reps);
  std::printf("%-8s %26s %30s\n", "codec", "compress (n, W chunks)", "aggregate (chunk n, W rows)");
  const std::vector<float>& x = tensors[0].second;
  for (const Codec* codec : AllCodecs()) {
    std::vector<float> err(n_pad, 0.0f), serr(n, 0.0f);
    std::vector<uint8_t> blocks(w * codec->BlockBytes(chunk));
    const Timing compress = Time(reps, [&] {
      (void)codec->Compress(*backend, x.data(), nullptr, 0.0f, n, w, chunk, err.data(),
                            blocks.data());
    });
    // W rows of one chunk of n elements: W compressions of x, one per row.
    std::vector<uint8_t> rows(w * codec->BlockBytes(n)), out(codec->BlockBytes(n));
    for (int r = 0; r < w; ++r) {
      std::vector<float> e(n, 0.0f);
      (void)codec->Compress(*backend, x.data(), nullptr, 0.0f, n, 1, n, e.data(),
                            rows.data() + r * codec->BlockBytes(n));
    }
    const Timing aggregate = Time(reps, [&] {
      (void)codec->Aggregate(*backend, rows.data(), w, n, serr.data(), out.data());
    });
    std::printf("%-8s %12.1f / %10.1f %14.1f / %13.1f\n", std::string(codec->name()).c_str(),
                1e3 * compress.cpu, 1e3 * compress.wall, 1e3 * aggregate.cpu,
                1e3 * aggregate.wall);
  }
  return 0;
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return onebit::Main();
}
