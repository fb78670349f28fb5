// The job config: one JSON file every process of a job reads. Its top level is DeepSpeed's
// (a DeepSpeed user's config works unchanged); onebit's own settings live in "onebit".
// Every key, with its type, default, allowed values and meaning, is in docs/config.md,
// generated from the table the parser walks (config/job_config_schema.cc): DeepSpeed's keys
// that mean nothing here, the batch rule and the lenient JSON are stated there.
//
// JobConfig is a plain value; the functions below keep no state and may run on any thread.
#ifndef ONEBIT_CONFIG_JOB_CONFIG_H_
#define ONEBIT_CONFIG_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config/optimizer_kind.h"

namespace onebit {

// The steps of a job that runs until its workers' training loops end (the Python package's
// jobs without `steps`; LeaseRequest.ended): the largest `steps` the config takes.
inline constexpr int64_t kOpenEndedSteps = int64_t{1} << 40;

// DeepSpeed's optimizer block (docs/algorithms.md has the math of each type).
// The default optimizer.params.update_clip.
inline constexpr double kDefaultUpdateClip = 2.0;

struct OptimizerConfig {
  // The "type": OneBitAdam, ZeroOneAdam, OneBitLamb or Adam (full precision throughout:
  // 1-bit Adam's warmup forever). Traits(kind) says what the rest of the system needs.
  OptimizerKind kind = OptimizerKind::kOneBitAdam;
  double lr = 1e-3;  // replaced by the scheduler's value when "scheduler" is set
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;  // added outside the sqrt
  double weight_decay = 0.0;
  // OneBitAdam, ZeroOneAdam: the bound on each element's m/(sqrt(v)+eps) on steps whose
  // variance is frozen (kernels::AdamHyper::update_clip); 0: none. It keeps the elements
  // whose variance froze at ~0 from moving by scale/eps (docs/algorithms.md, "eps and the
  // update clip").
  double update_clip = kDefaultUpdateClip;
  // Adam's bias correction, off by default (docs/algorithms.md). DeepSpeed's 1-bit optimizers
  // accept the key but never apply it: true here is a notice that results differ. For
  // "Adam" too the default is false (DeepSpeed's Adam defaults to true): onebit's Adam is
  // the full-precision baseline of 1-bit Adam, so it runs 1-bit Adam's warmup update.
  bool bias_correction = false;
  // OneBitAdam, OneBitLamb: the last warmup step (static freeze). "Adam" accepts it and
  // never freezes; ZeroOneAdam has var_freeze_step instead (freeze_step is an error there).
  int64_t freeze_step = 100000;
  std::string comm_backend_name = "gloo";  // "gloo" (CPU or GPU) or "nccl" (GPU)
  // ZeroOneAdam (0/1 Adam).
  int64_t var_freeze_step = 100000;  // the last step that may update the variance
  int64_t var_update_scaler = 16;    // kappa: variance updates before var_interval doubles
  int64_t local_step_scaler = 32678;  // local steps before local_step_interval doubles
  int64_t local_step_clipper = 16;    // H: the largest local_step_interval
  // OneBitLamb (1-bit LAMB): the trust ratio's clamp, its running average's factor, and
  // the compression stage's factor clamps.
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  double coeff_beta = 0.9;
  double factor_max = 4.0;
  double factor_min = 0.5;
  double factor_threshold = 0.1;
};

// DeepSpeed's "scheduler" block (deepspeed/runtime/lr_schedules.py); config/lr_schedule.h
// computes the learning rate of a step. Defaults are DeepSpeed's.
struct SchedulerConfig {
  // "" (none: optimizer.params.lr throughout), "WarmupLR", "WarmupDecayLR", "OneCycle" or
  // "WarmupCosineLR".
  std::string type;
  // WarmupLR, WarmupDecayLR (and WarmupCosineLR's warmup_num_steps, warmup_type).
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" or "linear"
  // WarmupDecayLR, WarmupCosineLR: required there.
  int64_t total_num_steps = 0;
  // WarmupCosineLR: fractions of optimizer.params.lr.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle. cycle_min_lr and cycle_max_lr are required. Stair counts are accepted and,
  // as in DeepSpeed's implementation, not used (the cycle is continuous).
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = -1;  // -1: cycle_first_step_size
  int64_t cycle_first_stair_count = 0;
  int64_t cycle_second_stair_count = -1;  // -1: cycle_first_stair_count
  int64_t decay_step_size = 0;
  // OneCycle's momentum cycling (beta1 inversely to the lr, beta2 = 0.99, as DeepSpeed
  // does; ScheduledBetas in lr_schedule.h), applied by the trainer before every step.
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// DeepSpeed's "fp16" and "bf16" blocks: what the CUDA workloads compute in (master
// parameters and optimizer state stay fp32). Both enabled is an error. The CPU path
// computes in fp32 whatever they say (notice).
struct PrecisionConfig {
  bool fp16 = false;
  double loss_scale = 0;        // 0: dynamic loss scaling; > 0: this fixed scale
  int initial_scale_power = 16;  // dynamic: starts at 2^initial_scale_power
  int loss_scale_window = 1000;  // dynamic: steps without overflow before the scale doubles
  int hysteresis = 2;            // dynamic: overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  bool bf16 = false;
};

// The most onebit.momentum_mask.ranges a config may list.
inline constexpr int kMaxMaskRanges = 10000;

// onebit.momentum_mask (docs/algorithms.md, "Momentum masks"): after every exchange m *= mask.
// The mask is supplied at every start (never restored from a checkpoint). config/
// momentum_mask.h builds it (BuildMomentumMask).
struct MomentumMaskConfig {
  // A 1-D .npy of the parameter count's values in {0, 1} (float32, bool or uint8); "": none.
  // A relative path is relative to each process's working directory.
  std::string npy;
  // Element ranges [begin, end) (half-open, as Python slices) that are MASKED: the mask is
  // 0 there and 1 everywhere else. Any order; overlaps are fine. Not together with npy. At
  // most kMaxMaskRanges (every member sends its config when it registers).
  std::vector<std::pair<int64_t, int64_t>> ranges;
  // Also mask every element whose gradient stayed exactly zero on every worker through
  // the warmup (detected by the trainer); off by default.
  bool auto_zero_grad = false;
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
  // hierarchical over inter peer (and inter ps with warmup_over "workers", for the warmup):
  // the transport between nodes, "auto" (the job's
  // comm_backend_name), "gloo" or "nccl". GPU workers with NCCL inside the node and gloo
  // between nodes compress on the device and stage only the packed blocks through the host
  // (worker/transport/staged_transport.h).
  std::string inter_transport = "auto";
  // Where the shards are (ps mode, hierarchical over inter ps): where the warmup's
  // full-precision sums go. "shards": through the parameter-server shards, as the
  // compressed stage. "workers": between the workers, as in peer mode (the fixed-order
  // allreduce over the workers' own transport, gloo or NCCL; hierarchical: between the
  // nodes' workers of the same local rank, in rank order, fp32), and the shards only serve
  // the compressed stage: they hold no state before it, so a
  // checkpoint of the warmup has no shard parts. Where the shards share the workers' hosts
  // the shards' warmup sends W streams into each link at once (BENCHMARKS.md, "ps shards
  // beside the workers"). Optimizers OneBitAdam and OneBitLamb (one switch to compression).
  std::string warmup_over = "shards";
  // What the full-precision (warmup) exchange carries on the wire: "fp32", or "bf16" /
  // "fp16" (half the bytes; partial sums rounded to nearest even, summed in float32; fp16
  // overflows to inf past 65504). Where the warmup goes between the workers only.
  std::string warmup_dtype = "fp32";
  // The fixed order of the full-precision sums (worker/exchange/exact_allreduce.h):
  // "rank" (from rank 0 up: the parameter-server shards' order, so ps and peer mode agree
  // bit for bit), "ring" (chunk v from rank v+1 round the ring: every link keeps one peer,
  // as in DDP's ring allreduce; a warmup between the workers, fp32 wire), or "auto": ring
  // where the warmup goes between the workers with the fp32 wire, rank otherwise. Every order gives the same bits on every transport;
  // with overlap and more than two workers, only the rank order gives the same bits as
  // without (a ring's order depends on where each bucket's chunks start).
  std::string warmup_order = "auto";
  // Peer mode, or ps with warmup_over "workers": exchange the full-precision (warmup, and
  // all of optimizer "Adam") gradient layer by layer while the backward pass computes the
  // layers before (workloads that announce layers: the CPU Fashion-MNIST MLP, onebit.torch's
  // models). Same bits either way; off by default in a job config (BENCHMARKS.md, "Warmup
  // exchange", says why).
  bool overlap = false;
  // The compressed exchange's wire format (kernels/kernels.h, compression/fp8/fp8_e4m3.h),
  // for every mode: "onebit" (1 bit and one scale per block), "int8" (a code per element, a
  // scale and an offset per block: 4x fewer bytes than fp32, for jobs that diverge at one
  // bit) or "fp8" (an e4m3 code per element and a power-of-two scale per 32 elements: 3.9x
  // fewer bytes than fp32, and a relative precision that does not depend on the block's
  // range). Workers and shards must agree; a shard rejects blocks of another format's size.
  std::string compressor = "onebit";
  // Hierarchical with local_size >= 2 only (an error elsewhere): local rank l keeps the
  // optimizer state (m, v, LAMB's extra tensors, the momentum mask) of its slice l only;
  // the parameters stay whole, all-gathered inside the node after each update. Same bits
  // as unsharded. Not with ZeroOneAdam: its local steps keep each worker's own state, so a
  // node has none to share. zero_optimization.stage 1 or 2 turns it on where it applies,
  // unless the key is given.
  bool shard_state = false;
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
  // "fashion_mnist", "synthetic", or "pytorch": the model of a training script that uses
  // the Python package (python/onebit), whose `parameters` is the model's parameter count.
  std::string type = "fashion_mnist";
  // fashion_mnist
  std::vector<int> hidden = {256, 128};
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t eval_every = 100;  // steps between test-set evaluations; 0: only at the end
  // synthetic; pytorch (the model's count, checked by each worker; for pytorch 0 means
  // "learned from the workers": the coordinator takes the first worker's, checks the others
  // against it and hands it to the shards, JobStatus.num_parameters)
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
// onebit.checkpoint.every_steps where a dir is given without it.
inline constexpr int64_t kDefaultCheckpointEverySteps = 1000;

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

// The secured control plane (docs/security.md; security/tls.h, security/auth.h). Every
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
  int64_t micro_batch = 64;  // train_micro_batch_size_per_gpu: per worker and micro batch
  // Micro batches per optimizer step; the trainer averages their gradients.
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0;  // clip the averaged gradient's global L2 norm to this; 0: off
  int64_t steps = 600;
  uint64_t seed = 1;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  PrecisionConfig precision;
  int workers = 1;
  std::string device = "cpu";  // "cpu" or "cuda"
  // Threads of the CPU kernels in each worker and shard (the exchange's compression, the
  // optimizer update). 0: the CPUs the process may use (affinity and cgroup quota),
  // divided among the workers a launcher says share the machine (LOCAL_WORLD_SIZE, as
  // torchrun and onebit-run set it); onebit-launch divides them among all its processes.
  // Any value gives the same bits.
  int cpu_threads = 0;
  ExchangeConfig exchange;
  FreezeConfig freeze;
  MomentumMaskConfig momentum_mask;
  int64_t lease_steps = 10;
  WorkloadConfig workload;
  PortsConfig ports;
  int64_t log_every = 20;
  CheckpointConfig checkpoint;
  FailureConfig failure;
  SecurityConfig security;
  // What the parser accepted but the job ignores or derived, one line each, sorted, e.g.
  // "optimizer.params.cuda_aware: accepted, no effect here (...)". Not part of the config:
  // JobConfigToJson leaves them out. The parser prints nothing: the coordinator prints them
  // once at start, a worker or shard under --check, the launcher when it does not echo the
  // coordinator.
  std::vector<std::string> notices;
};

// DeepSpeed's train_batch_size: micro_batch * gradient_accumulation_steps * workers (what
// JobConfigToJson prints, so a config built in code stays consistent).
int64_t TrainBatchSize(const JobConfig& config);
// The last warmup step the config gives: the params key Traits(kind).warmup_end_key names
// (var_freeze_step for ZeroOneAdam, the end of its variance stage; freeze_step otherwise).
int64_t WarmupEndStep(const OptimizerConfig& optimizer);
// The field that WarmupEndStep reads.
int64_t* MutableWarmupEndStep(OptimizerConfig* optimizer);

// True when the job has onebit-server shards: ps mode, or hierarchical over ps.
bool UsesServers(const ExchangeConfig& exchange);
// The number of onebit-server processes the job has (0 without shards).
int ServerCount(const JobConfig& config);

// Whether the warmup's full-precision sums go between the workers: peer mode, and ps mode
// with warmup_over "workers" (hierarchical: inside a node they always do).
bool WarmupBetweenWorkers(const ExchangeConfig& exchange);
// Whether the job has shards that take no part in the warmup (exchange.warmup_over
// "workers"): they hold no state before the first compressed step.
bool ShardsSkipWarmup(const ExchangeConfig& exchange);

// Whether the trainer runs fp16's loss scaling (worker/optim/loss_scaler.h; steps that
// overflowed anywhere are skipped on every worker): fp16 on a CUDA device, or with
// workload pytorch on any device (the script's torch.autocast decides what computes in
// fp16; onebit scales its loss and agrees on overflows).
bool ScalesLoss(const JobConfig& config);

// Whether the scheduler moves the betas too (OneCycle with cycle_momentum).
bool SchedulerCyclesBetas(const JobConfig& config);

// exchange.warmup_order with "auto" resolved: "rank" or "ring".
std::string EffectiveWarmupOrder(const ExchangeConfig& exchange);

// Parses and validates; errors name the offending key's path. What was accepted without
// effect, or derived, is in the result's `notices`.
absl::StatusOr<JobConfig> ParseJobConfig(absl::string_view json);
// Reads `path` and parses it; errors also name the file.
absl::StatusOr<JobConfig> LoadJobConfig(const std::string& path);
// `text` as strict JSON: the comments and trailing commas a config may have (DeepSpeed's
// files do) taken out, as ParseJobConfig takes them out. INVALID_ARGUMENT for an
// unterminated /* comment.
absl::StatusOr<std::string> StrictJson(absl::string_view text);
// The config as JSON again (every key, defaults filled in).
std::string JobConfigToJson(const JobConfig& config);

// What the workers of one job (and its shards among themselves) must agree on: the config
// as JSON (JobConfigToJson) with what may differ between processes left at its default:
// where a process runs and how (device, cpu_threads, log_every, ports), its paths
// (workload.data_dir, momentum_mask.npy, checkpoint.dir, security), how it waits and
// retries (failure), and what only the coordinator reads (workload.eval_every, checkpoint
// keep/async/resume). A worker that read its momentum mask from a .npy passes the mask's
// MomentumMaskSummary (config/momentum_mask.h) as `mask_summary`: it stands where the
// file's path was, so the files' contents are compared, not their paths.
// RegisterRequest.job_terms: a member whose terms are not those of the first member of its
// role fails the job.
std::string JobTerms(const JobConfig& config, const std::string& mask_summary = "");
// The keys where two JobTerms texts differ, at most `max_keys` of them, each with both
// values, `first_label` naming the first's: "optimizer.params.lr 0.002 (worker 0's:
// 0.001)", joined by "; ". "" when equal.
std::string JobTermsDifference(const std::string& first, const std::string& other,
                               const std::string& first_label, size_t max_keys);

}  // namespace onebit

#endif  // ONEBIT_CONFIG_JOB_CONFIG_H_
