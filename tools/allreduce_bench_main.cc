// The full-precision exchange alone, one process per rank over gloo/TCP (run one in each
// node of tools/emulated_cluster.sh; tools/bench_warmup.sh does), against gloo's own ring
// allreduce, which is what PyTorch DDP calls for CPU tensors over gloo:
//
//   onebit-allreduce-bench --rank=R --world=W --hostname=ADDR --store=/tmp/dir
//       --n=25000000 --iters=5 --algos=gloo_ring,alltoall,ring,ring_bf16
//
// algos: gloo_ring  gloo's ring allreduce, in place (the DDP baseline; the copy of the
//                   input into its buffer is not timed)
//        alltoall   the former ExactAllreduce: AllToAll of the chunks, SumRows in rank
//                   order, AllGather (the baseline)
//        ring, ring_bf16, ring_fp16   ExactAllreduce (W-1 shift steps of SendRecv in
//                   rank-order sums, pipelined: --segment, --in_flight; wire dtype)
//        ringsum    ExactAllreduce in ring order (SumOrder::kRing: fixed neighbours)
// Each iteration starts after a barrier; rank 0 prints one JSON line per algorithm with
// the median and every iteration's seconds and the bytes this rank sent per iteration.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gloo/rendezvous/file_store.h"
#include "kernels/buffer.h"
#include "kernels/kernels.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/transport/gloo_transport.h"

ABSL_FLAG(int, rank, 0, "This process's rank.");
ABSL_FLAG(int, world, 1, "Number of ranks.");
ABSL_FLAG(std::string, hostname, "127.0.0.1", "Address to bind and advertise.");
ABSL_FLAG(std::string, store, "", "Directory shared by all ranks for the rendezvous.");
ABSL_FLAG(int64_t, n, 25000000, "float32 elements.");
ABSL_FLAG(int, iters, 5, "Timed iterations per algorithm (after one untimed).");
ABSL_FLAG(std::string, algos, "gloo_ring,alltoall,ring,ring_bf16", "Comma-separated.");
ABSL_FLAG(int64_t, segment, 0, "ExactAllreduce segment elements (0: the default).");
ABSL_FLAG(int, in_flight, 0, "ExactAllreduce max_in_flight (0: the default; 1: unpipelined).");

namespace onebit {
namespace {

// The former ExactAllreduce (before the ring order), kept here as the baseline.
class AllToAllAllreduce {
 public:
  static absl::StatusOr<std::unique_ptr<AllToAllAllreduce>> Create(kernels::Backend* b,
                                                                   Transport* t, size_t n) {
    auto a = std::unique_ptr<AllToAllAllreduce>(new AllToAllAllreduce(b, t, n));
    const size_t w = t->world_size();
    ONEBIT_ASSIGN_OR_RETURN(a->send_, kernels::Buffer<float>::Create(b, w * a->chunk_));
    ONEBIT_ASSIGN_OR_RETURN(a->received_, kernels::Buffer<float>::Create(b, w * a->chunk_));
    ONEBIT_ASSIGN_OR_RETURN(a->summed_, kernels::Buffer<float>::Create(b, a->chunk_));
    ONEBIT_ASSIGN_OR_RETURN(a->gathered_, kernels::Buffer<float>::Create(b, w * a->chunk_));
    return a;
  }
  absl::Status Run(const float* in) {
    const size_t bytes = chunk_ * sizeof(float);
    ONEBIT_RETURN_IF_ERROR(backend_->Copy(send_.data(), in, n_ * sizeof(float)));
    ONEBIT_RETURN_IF_ERROR(transport_->AllToAll(send_.data(), received_.data(), bytes));
    ONEBIT_RETURN_IF_ERROR(
        backend_->SumRows(received_.data(), transport_->world_size(), chunk_, summed_.data()));
    return transport_->AllGather(summed_.data(), gathered_.data(), bytes);
  }

 private:
  AllToAllAllreduce(kernels::Backend* b, Transport* t, size_t n)
      : backend_(b), transport_(t), n_(n), chunk_((n + t->world_size() - 1) / t->world_size()) {}
  kernels::Backend* backend_;
  Transport* transport_;
  size_t n_, chunk_;
  kernels::Buffer<float> send_, received_, summed_, gathered_;
};

absl::Status Main() {
  const int rank = absl::GetFlag(FLAGS_rank), world = absl::GetFlag(FLAGS_world);
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_n));
  const int iters = absl::GetFlag(FLAGS_iters);
  if (absl::GetFlag(FLAGS_store).empty()) return absl::InvalidArgumentError("--store is required");
  if (iters < 1) return absl::InvalidArgumentError("--iters must be >= 1");
  auto store = std::make_shared<gloo::rendezvous::FileStore>(absl::GetFlag(FLAGS_store));
  GlooOptions options;
  options.hostname = absl::GetFlag(FLAGS_hostname);
  options.timeout = absl::Seconds(600);
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<GlooTransport> t,
                          GlooTransport::Create(store, rank, world, options));
  auto backend = kernels::NewCpuBackend();
  std::vector<float> input(n);
  std::mt19937 rng(rank + 1);
  std::normal_distribution<float> dist;
  for (float& x : input) x = dist(rng);
  std::vector<float> work(n);

  const std::vector<std::string> algos = absl::StrSplit(absl::GetFlag(FLAGS_algos), ',');
  for (const std::string& algo : algos) {
    std::function<absl::Status()> run;
    std::function<void()> prepare = [] {};  // untimed, before each iteration
    std::unique_ptr<ExactAllreduce> exact;
    std::unique_ptr<AllToAllAllreduce> alltoall;
    if (algo == "gloo_ring") {
      // In place, like DDP's bucket: the copy of the input is not timed.
      prepare = [&] { std::copy(input.begin(), input.end(), work.begin()); };
      run = [&] { return t->AllReduceSum(work.data(), n); };
    } else if (algo == "alltoall") {
      ONEBIT_ASSIGN_OR_RETURN(alltoall, AllToAllAllreduce::Create(backend.get(), t.get(), n));
      run = [&] { return alltoall->Run(input.data()); };
    } else if (algo == "ring" || algo == "ring_bf16" || algo == "ring_fp16" ||
               algo == "ringsum") {
      ExactAllreduceOptions o;
      if (algo == "ringsum") {
        o.order = SumOrder::kRing;
      } else if (algo != "ring") {
        ONEBIT_ASSIGN_OR_RETURN(o.wire_dtype, ParseWireDtype(algo.substr(5)));
      }
      if (absl::GetFlag(FLAGS_segment) > 0) o.segment_elements = absl::GetFlag(FLAGS_segment);
      if (absl::GetFlag(FLAGS_in_flight) > 0) o.max_in_flight = absl::GetFlag(FLAGS_in_flight);
      ONEBIT_ASSIGN_OR_RETURN(exact, ExactAllreduce::Create(backend.get(), t.get(), n, o));
      run = [&] { return exact->Run(input.data()); };
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown algorithm ", algo));
    }
    std::vector<double> seconds;
    uint64_t sent = 0;
    for (int i = 0; i <= iters; ++i) {
      prepare();
      ONEBIT_RETURN_IF_ERROR(t->Barrier());
      const uint64_t before = t->bytes_sent();
      const absl::Time start = absl::Now();
      ONEBIT_RETURN_IF_ERROR(run());
      if (i > 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));  // 0: warm-up
      sent = t->bytes_sent() - before;
    }
    std::vector<double> sorted = seconds;
    std::sort(sorted.begin(), sorted.end());
    if (rank == 0) {
      std::printf("{\"algo\": \"%s\", \"world\": %d, \"n\": %zu, \"bytes_sent\": %llu, "
                  "\"median_s\": %.4f, \"seconds\": [%s]}\n",
                  std::string(algo).c_str(), world, n, static_cast<unsigned long long>(sent),
                  sorted[sorted.size() / 2], absl::StrJoin(seconds, ", ").c_str());
      std::fflush(stdout);
    }
  }
  return t->Barrier();
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = onebit::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "onebit-allreduce-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
