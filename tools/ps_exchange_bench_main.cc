// ps mode's exchange alone on loopback: S shards (ServerProcess, in this process) and W
// workers (one PsExchange each, on threads of this process) over gRPC on 127.0.0.1:
//
//   onebit-ps-exchange-bench --workers=4 --shards=4 --n=25000000 --iters=5 --stage=warmup
//
// stage: warmup       SumGradients (fp32 runs, summed in rank order on the shards)
//        compression  AverageMomentum (one compressed block per shard)
// Each iteration is one step: all W calls start together on fresh threads and the time is
// until the last returns (one untimed step first). Prints one JSON line with the median
// and every iteration's seconds, wall and CPU (the whole process: workers and shards,
// user and system; on a shared machine the steadier of the two). The peer-mode counterpart is onebit-allreduce-bench.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "kernels/kernels.h"
#include "server/server_process.h"
#include "worker/exchange/ps_exchange.h"

ABSL_FLAG(int, workers, 4, "Workers (threads, one PsExchange each).");
ABSL_FLAG(int, shards, 4, "Shards (ServerProcess, in this process).");
ABSL_FLAG(int64_t, n, 25000000, "float32 elements.");
ABSL_FLAG(int, iters, 5, "Timed steps (after one untimed).");
ABSL_FLAG(std::string, stage, "warmup", "warmup (SumGradients) or compression (AverageMomentum).");

namespace onebit {
namespace {

// CPU time of the whole process (every worker and shard thread, user and system).
double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

absl::Status Main() {
  const int workers = absl::GetFlag(FLAGS_workers);
  const int num_shards = absl::GetFlag(FLAGS_shards);
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_n));
  const int iters = absl::GetFlag(FLAGS_iters);
  const std::string stage = absl::GetFlag(FLAGS_stage);
  if (workers < 1 || num_shards < 1 || n < 1 || iters < 1) {
    return absl::InvalidArgumentError("--workers, --shards, --n and --iters must be >= 1");
  }
  if (stage != "warmup" && stage != "compression") {
    return absl::InvalidArgumentError(absl::StrCat("unknown --stage ", stage));
  }
  std::vector<std::unique_ptr<server::ServerProcess>> shards;
  std::vector<std::string> addresses;
  for (int s = 0; s < num_shards; ++s) {
    server::ServerProcessOptions options;
    options.shard = server::ShardConfig{s, num_shards, workers, n, 2};
    options.serve_metrics = false;
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<server::ServerProcess> shard,
                            server::ServerProcess::Start(options));
    addresses.push_back(shard->grpc_address());
    shards.push_back(std::move(shard));
  }
  std::vector<std::unique_ptr<kernels::Backend>> backends;
  std::vector<std::unique_ptr<PsExchange>> exchanges;
  std::vector<std::vector<float>> grads;
  for (int w = 0; w < workers; ++w) {
    backends.push_back(kernels::NewCpuBackend());
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PsExchange> exchange,
                            PsExchange::Create(backends.back().get(), w, workers, n, addresses));
    exchanges.push_back(std::move(exchange));
    // Cheap values in [-1, 1) (the exchange does not care which): a fast start.
    std::vector<float> g(n);
    uint32_t x = 2463534242u + static_cast<uint32_t>(w);
    for (float& v : g) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      v = static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f;
    }
    grads.push_back(std::move(g));
  }
  std::vector<double> seconds, cpu_seconds;
  for (int i = 0; i <= iters; ++i) {
    const int64_t step = i + 1;
    std::vector<absl::Status> status(workers);
    const absl::Time start = absl::Now();
    const double cpu_start = ProcessCpuSeconds();
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) {
      threads.emplace_back([&, w] {
        if (stage == "warmup") {
          status[w] = exchanges[w]->SumGradients(step, grads[w].data()).status();
        } else {
          status[w] = exchanges[w]
                          ->AverageMomentum(step, grads[w].data(), grads[w].data(), 0.9f)
                          .status();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
    const double cpu = ProcessCpuSeconds() - cpu_start;
    for (const absl::Status& s : status) ONEBIT_RETURN_IF_ERROR(s);
    if (i > 0) {  // 0: warm-up
      seconds.push_back(elapsed);
      cpu_seconds.push_back(cpu);
    }
  }
  std::vector<double> sorted = seconds, sorted_cpu = cpu_seconds;
  std::sort(sorted.begin(), sorted.end());
  std::sort(sorted_cpu.begin(), sorted_cpu.end());
  std::printf("{\"system\": \"ps\", \"stage\": \"%s\", \"workers\": %d, \"shards\": %d, "
              "\"n\": %zu, \"bytes_sent_per_worker\": %llu, \"median_s\": %.4f, "
              "\"median_cpu_s\": %.4f, \"seconds\": [%s], \"cpu_seconds\": [%s]}\n",
              stage.c_str(), workers, num_shards, n,
              static_cast<unsigned long long>(exchanges[0]->bytes_sent() / (iters + 1)),
              sorted[sorted.size() / 2], sorted_cpu[sorted_cpu.size() / 2],
              absl::StrJoin(seconds, ", ").c_str(), absl::StrJoin(cpu_seconds, ", ").c_str());
  std::fflush(stdout);
  exchanges.clear();
  return absl::OkStatus();
}

}  // namespace
}  // namespace onebit

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = onebit::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "onebit-ps-exchange-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
