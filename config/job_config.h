// The job config: one JSON file shared by every process of a job. The optimizer block is
// DeepSpeed's, so a DeepSpeed user recognises it; onebit's own settings live in "onebit".
//
//   {
//     "train_micro_batch_size_per_gpu": 64,        // per worker
//     "steps": 600,
//     "seed": 1,
//     "optimizer": {
//       "type": "OneBitAdam",                      // or "Adam": full precision throughout
//       "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0,
//                  "freeze_step": 100, "comm_backend_name": "gloo"}   // gloo | nccl
//     },
//     "onebit": {
//       "workers": 4,
//       "device": "cpu",                           // cpu | cuda
//       "cpu_threads": 0,                          // CPU kernels' threads; 0: all usable
//       "exchange": {"mode": "ps", "servers": 2},  // peer | ps | hierarchical, see ExchangeConfig
//       "freeze": {"mode": "static"},              // static | automatic, see FreezeConfig
//       "lease_steps": 10,
//       "workload": {"type": "fashion_mnist", "hidden": [256, 128], "eval_every": 100,
//                    "data_dir": "/usr/share/datasets/fashion-mnist"},
//       "ports": {"coordinator": 0, "coordinator_rest": 0, "metrics": 0, "server": 0},
//       "log_every": 20,
//       "checkpoint": {"dir": "/ckpt", "every_steps": 100, "keep": 3, "resume": true},
//       "failure": {"heartbeat_timeout_s": 10, "rejoin_timeout_s": 300, "max_restarts": 3, ...},
//       "security": {"tls": {"ca_cert": "/etc/onebit/ca.pem", "cert": "/etc/onebit/node.pem",
//                            "key": "/etc/onebit/node.key", "mutual": true},
//                    "admin_token_file": "/etc/onebit/admin.token",
//                    "member_token_file": "/etc/onebit/member.token"}
//     }
//   }
//
// Unknown keys and bad values are errors that name the key's path, e.g.
// "onebit.exchange.servers: must be >= 1 in ps mode".
#ifndef ONEBIT_CONFIG_JOB_CONFIG_H_
#define ONEBIT_CONFIG_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace onebit {

struct OptimizerConfig {
  std::string type = "OneBitAdam";  // "OneBitAdam" or "Adam"
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  // Last warmup step (static freeze). "Adam" never freezes.
  int64_t freeze_step = 100000;
  std::string comm_backend_name = "gloo";  // "gloo" (CPU) or "nccl" (GPU)
};

struct ExchangeConfig {
  // "peer": every worker is the server of its own chunk. "ps": dedicated shards.
  // "hierarchical": full precision inside a node, 1-bit between nodes (the `inter` path).
  std::string mode = "peer";
  int servers = 0;  // parameter-server shards: >= 1 in ps mode and hierarchical over ps
  // hierarchical: workers per node. Ranks are node-major: worker r is local rank
  // r % local_size of node r / local_size; workers must be a multiple of it.
  int local_size = 1;
  // hierarchical: how a node's slice crosses nodes, "peer" or "ps" (then servers must be a
  // multiple of local_size: local rank l uses shards [l*K, (l+1)*K), K = servers/local_size).
  std::string inter = "peer";
  // What the full-precision (warmup) exchange carries on the wire: "fp32", or "bf16" /
  // "fp16" (half the bytes; partial sums rounded to nearest even, summed in float32; fp16
  // overflows to inf past 65504). Peer mode only.
  std::string warmup_dtype = "fp32";
  // The fixed order of the full-precision sums (worker/exchange/exact_allreduce.h):
  // "rank" (from rank 0 up: the parameter-server shards' order, so ps and peer mode agree
  // bit for bit), "ring" (chunk v from rank v+1 round the ring: every link keeps one peer,
  // as in DDP's ring allreduce; peer mode, fp32 wire), or "auto": ring in peer mode with
  // the fp32 wire and no overlap, rank otherwise. Every order gives the same bits on every
  // transport; with overlap, only the rank order gives the same bits as without (a ring's
  // order depends on where each bucket's chunks start).
  std::string warmup_order = "auto";
  // Peer mode: exchange the full-precision (warmup, and all of optimizer "Adam") gradient
  // layer by layer while the backward pass computes the layers before (workloads that
  // announce layers: the CPU Fashion-MNIST MLP). Same bits either way; off by default
  // (BENCHMARKS.md, "Warmup exchange", says why).
  bool overlap = false;
  // The compressed exchange's wire format (kernels/kernels.h), for every mode: "onebit"
  // (1 bit and one scale per block) or "int8" (a code per element, a scale and an offset
  // per block: 4x fewer bytes than fp32, for jobs that diverge at one bit). Workers and
  // shards must agree; a shard rejects blocks of the other format's size.
  std::string compressor = "onebit";
};


struct FreezeConfig {
  std::string mode = "static";  // "static" (optimizer.params.freeze_step) or "automatic"
  // Automatic: freeze when ||v_t - v_{t-k}|| / ||v_t|| (k = report_interval) stays under
  // `threshold` for `reports_in_a_row` reports, but not before min_warmup steps; freeze at
  // max_warmup steps at the latest.
  double threshold = 0.05;
  int reports_in_a_row = 3;
  int64_t report_interval = 10;
  int64_t min_warmup = 50;
  int64_t max_warmup = 1000;
};

struct WorkloadConfig {
  std::string type = "fashion_mnist";  // "fashion_mnist" or "synthetic"
  // fashion_mnist
  std::vector<int> hidden = {256, 128};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t eval_every = 100;  // steps between test-set evaluations; 0: only at the end
  // synthetic
  int64_t parameters = 1000000;
};

struct PortsConfig {
  // 0 picks a free port; a process reports what it bound to the coordinator.
  int coordinator = 0;
  int coordinator_rest = 0;
  int metrics = 0;
  int server = 0;
};

// Two-phase-commit checkpoints (checkpoint/manifest.h). Every process of the job reads and
// writes the same directory: a local disk for a one-machine job, a shared volume otherwise.
struct CheckpointConfig {
  std::string dir;          // "": no checkpoints and no resume
  int64_t every_steps = 0;  // a checkpoint after every multiple of this step; 0: on demand only
  int keep = 3;             // committed checkpoints kept (the newest)
  // Resume from the newest committed checkpoint in `dir` when the coordinator starts.
  bool resume = true;
  // false: a worker writes its part before its next step (training pauses for the write).
  // true: training pauses only for a host snapshot and a thread writes the part meanwhile;
  // a worker that dies before its part is written loses that checkpoint, not an older one.
  bool async = false;
};

// Failure detection and recovery, and the timeouts of every wait (defaults for a real
// cluster). A member without a heartbeat for heartbeat_timeout_s is dead; then every other
// member exits with code 75 to be restarted, and once the whole membership has registered
// again the job resumes from the last committed checkpoint. After max_restarts recoveries,
// or when the membership is not back within rejoin_timeout_s, the job is declared failed.
struct FailureConfig {
  double heartbeat_timeout_s = 10;
  double rejoin_timeout_s = 300;
  int max_restarts = 3;
  // How long members retry an unreachable coordinator before giving up.
  double coordinator_retry_s = 120;
  // gloo: connecting the mesh, and each collective (a dead peer is noticed this late at
  // the latest).
  double gloo_timeout_s = 60;
  // Waiting for peers to publish their rendezvous data (NCCL ids, shard addresses).
  double rendezvous_timeout_s = 300;
  // ps mode: the longest one step's push and pull may take.
  double ps_step_deadline_s = 120;
};

// The secured control plane (README "Security"; security/tls.h, security/auth.h). Every
// key is optional; none set is the plaintext, open job of before. Paths are as given
// (relative ones to each process's working directory). Flags of each binary override.
struct TlsConfig {
  // The CA that every certificate of the job chains to; this process's certificate and
  // key. Setting any of them turns TLS on for every gRPC port and for the REST mirror
  // (HTTPS); servers then need cert and key.
  std::string ca_cert;
  std::string cert;
  std::string key;
  // Servers require and verify a client certificate (mutual TLS): only holders of a
  // certificate of the job's CA can connect at all.
  bool mutual = true;
  // Clients check the servers' certificates against this name instead of the dialled host.
  std::string server_name;
};

struct SecurityConfig {
  TlsConfig tls;
  // Files holding the bearer tokens (security/auth.h): the admin token guards the calls
  // that change the job; the member token, the calls of the job's processes and reads.
  std::string admin_token_file;
  std::string member_token_file;
};

struct JobConfig {
  int64_t micro_batch = 64;  // train_micro_batch_size_per_gpu: per worker and step
  int64_t steps = 600;
  uint64_t seed = 1;
  OptimizerConfig optimizer;
  int workers = 1;
  std::string device = "cpu";  // "cpu" or "cuda"
  // Threads of the CPU kernels in each worker and shard (the exchange's compression, the
  // optimizer update). 0: the CPUs the process may use (affinity and cgroup quota); the
  // local launcher divides the machine's among its processes instead. Any value gives the
  // same bits.
  int cpu_threads = 0;
  ExchangeConfig exchange;
  FreezeConfig freeze;
  int64_t lease_steps = 10;
  WorkloadConfig workload;
  PortsConfig ports;
  int64_t log_every = 20;
  CheckpointConfig checkpoint;
  FailureConfig failure;
  SecurityConfig security;
};

// True when the job has onebit-server shards: ps mode, or hierarchical over ps.
bool UsesServers(const ExchangeConfig& exchange);
// The number of onebit-server processes the job has (0 without shards).
int ServerCount(const JobConfig& config);

// Parses and validates; errors name the offending key's path.
// exchange.warmup_order with "auto" resolved: "rank" or "ring".
std::string EffectiveWarmupOrder(const ExchangeConfig& exchange);

absl::StatusOr<JobConfig> ParseJobConfig(absl::string_view json);
// Reads `path` and parses it; errors also name the file.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);
// The config as JSON again (every key, defaults filled in).
std::string JobConfigToJson(const JobConfig& config);

}  // namespace onebit

#endif  // ONEBIT_CONFIG_JOB_CONFIG_H_
