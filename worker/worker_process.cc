// The body of onebit-worker (worker_main.cc), as a library: the Python package runs it on
// a thread of the training process (python/onebit).
#include "worker/worker_process.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "prometheus/registry.h"
#include "common/metrics_server.h"
#include "common/signals.h"
#include "coordinator/coordinator_client.h"
#include "coordinator/member.h"
#include "worker/transport/coordinator_gloo_store.h"
#include "config/job_config.h"
#include "config/model_spec.h"
#include "kernels/cuda_backend.h"
#include "kernels/kernels.h"
#include "common/status_macros.h"
#include "common/npy.h"
#include "config/momentum_mask.h"
#include "common/atomic_file.h"
#include "checkpoint/manifest.h"
#include "worker/checkpointer.h"
#include "common/fault.h"
#include "common/parallel.h"
#include "common/process_memory.h"
#include "worker/coordinator_step_controller.h"
#include "worker/fault_exchange.h"
#include "worker/transport/gloo_transport.h"
#include "worker/job_setup.h"
#include "worker/transport/nccl_transport.h"
#include "worker/transport/staged_transport.h"
#include "worker/transport/call_trace.h"
#include "worker/transport/traced_transport.h"
#include "compression/codec_registry.h"
#include "compression/layout.h"
#include "worker/exchange/exact_allreduce.h"
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/exchange/ps_exchange.h"
#include "worker/exchange/workers_warmup_exchange.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"
#include "security/auth.h"
#include "security/flags.h"


namespace onebit {
namespace {

std::string InstanceId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  return absl::StrFormat("%s:%d:%08x", host, getpid(), rd());
}

// Forwards to the Prometheus metrics and, with --history_csv, writes one CSV row per step
// and per evaluation, for loss curves:
//   step,kind,stage,loss,seconds,bytes_sent,test_loss,test_accuracy,compute_seconds,unix_time,
//   compress_seconds,exchange_seconds,update_seconds
// (seconds = compute + compress + exchange + update, StepReport's split; compute_seconds: the
// gradient alone; unix_time: when the step was recorded, for lining steps up with outside
// measurements)
class HistorySink : public TrainerMetricsSink {
 public:
  HistorySink(TrainerMetricsSink* next, const std::string& path) : next_(next) {
    if (!path.empty()) {
      out_.open(path);
      out_ << "step,kind,stage,loss,seconds,bytes_sent,test_loss,test_accuracy,compute_seconds,"
              "unix_time,compress_seconds,exchange_seconds,update_seconds\n";
    }
  }
  void RecordStep(const StepReport& r) override {
    next_->RecordStep(r);
    if (out_.is_open()) {
      out_ << r.step << ",step," << StageName(r.stage) << ",";
      if (r.loss_given) out_ << r.loss;  // else empty, as in the eval rows
      out_ << "," << r.seconds() << "," << r.bytes_sent << ",,,"
           << r.compute_seconds << ","
           << absl::StrFormat("%.6f", absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()))
           << "," << r.compress_seconds << "," << r.exchange_seconds << "," << r.update_seconds
           << "\n";
    }
  }
  void RecordCheckpoint(int64_t step, double seconds) override {
    next_->RecordCheckpoint(step, seconds);
  }
  void RecordEval(int64_t step, const EvalResult& e) override {
    next_->RecordEval(step, e);
    if (out_.is_open()) {
      out_ << step << ",eval,,,,," << e.loss << "," << e.accuracy.value_or(-1) << ",,,,,\n";
      out_.flush();
    }
  }

 private:
  TrainerMetricsSink* next_;
  std::ofstream out_;
};

// The job's parts, in the order they must be torn down (reverse), and what the steps of
// RunWorkerProcess share.
struct Worker {
  std::string host;           // WorkerProcessOptions::host: gloo, /metrics, push order
  security::TlsOptions tls;   // the security flags over the config's
  const Codec* codec = nullptr;  // the job's exchange.compressor (the registry's, not owned)
  // Outlives everything below: the step controller's report thread calls it until joined.
  std::shared_ptr<CoordinatorClient> client;
  std::shared_ptr<prometheus::Registry> registry;
  std::unique_ptr<MetricsServer> metrics;
  std::unique_ptr<WorkerMetrics> metrics_sink;
  std::unique_ptr<HistorySink> sink;
  std::unique_ptr<CoordinatorSession> session;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<Workload> workload;
  std::unique_ptr<CallTrace> trace;  // --transport_trace of ps pushes and the world group
  // peer, and ps with the warmup between the workers: the job; hierarchical: the node
  std::unique_ptr<Transport> transport;
  // hierarchical over peer, and over ps with the warmup between the workers: between nodes
  std::unique_ptr<Transport> inter_transport;
  std::unique_ptr<Exchange> exchange;
  std::unique_ptr<Exchange> fault_exchange;  // --fault=kill_in_exchange: wraps `exchange`
  std::unique_ptr<CoordinatorStepController> controller;
  std::unique_ptr<WorkerCheckpointer> checkpointer;
  std::unique_ptr<Trainer> trainer;
};

// The threads of a worker's CPU backend (WorkerCpuThreads): the flag's, else the config's,
// else the usable cores shared among the workers a launcher put on this machine.
int CpuThreads(const WorkerProcessOptions& o, const JobConfig& config) {
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (local == nullptr) local = std::getenv("ONEBIT_LOCAL_WORLD_SIZE");
  return WorkerCpuThreads(o.cpu_threads, config, UsableCpus(), local);
}

// `transport` in `backend`'s memory: itself when the two agree (the CPU's gloo; NCCL on a
// GPU); else (a GPU worker over gloo) a StagedTransport over it, so that the compression
// runs on the device and only what the collectives send crosses PCIe.
absl::StatusOr<std::unique_ptr<Transport>> InBackendMemory(kernels::Backend* backend,
                                                           std::unique_ptr<Transport> transport) {
  if (transport->memory_space() == backend->memory_space()) return transport;
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<StagedTransport> staged,
                          StagedTransport::Create(backend, std::move(transport)));
  return std::unique_ptr<Transport>(std::move(staged));
}

// `shards`: the addresses of the shards this worker pushes to.
PsExchangeOptions PsOptions(const JobConfig& config, const std::vector<std::string>& shards,
                            const Worker& w) {
  PsExchangeOptions options;
  // Shards beside this worker: the staggered pushes start after its host (ps_exchange.h).
  PushPlan plan = PlanPushes(w.host, shards);
  if (!plan.local.empty()) {
    std::fprintf(stderr, "ps: shards [%s] run on this host (%s): large pushes go [%s]\n",
                 absl::StrJoin(plan.local, ", ").c_str(), w.host.c_str(),
                 absl::StrJoin(plan.order, ", ").c_str());
  }
  options.push_order = std::move(plan.order);
  options.local_shards = std::move(plan.local);
  options.codec = w.codec;
  options.step_deadline = absl::Seconds(config.failure.ps_step_deadline_s);
  options.tls = w.tls;
  return options;
}

// EXIT CODES (coordinator/member.h): 0 done; 75 the job recovers in a newer generation, or
// the coordinator restarted and no longer knows this worker (restart this process); 78 the
// job failed (do not restart); 1 this worker hit an error; 2 bad flags or config.

// An error a peer's failure may have caused: a connection that broke or a wait that timed
// out (gloo, the shards' gRPC). Others are this worker's own.
bool MayBeAPeersFailure(const absl::Status& error) {
  return absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error);
}

// Leaves at once: the training thread may be blocked in a collective with a dead peer
// (every file this process writes is atomic).
[[noreturn]] void Leave(int rank, const MemberVerdict& verdict) {
  std::fprintf(stderr, "worker rank %d: %s\n", rank, verdict.reason.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(verdict.exit_code);
}

// The verdict ends this member's part: `on_verdict` hears of it where given, else the
// process leaves (Leave).
void Depart(const std::function<void(const MemberVerdict&)>& on_verdict, int rank,
            const MemberVerdict& verdict) {
  if (!on_verdict) Leave(rank, verdict);
  on_verdict(verdict);
}

}  // namespace

void WorkerMember::Connected(std::shared_ptr<CoordinatorClient> client,
                             std::shared_ptr<CoordinatorClient> once,
                             const std::string& instance_id) {
  absl::MutexLock lock(&mu_);
  client_ = std::move(client);
  once_ = std::move(once);
  instance_id_ = instance_id;
  me_ = MemberIdentity{};
  rank_ = -1;
  decided_.reset();
}

void WorkerMember::Registered(const MemberIdentity& me, int rank, absl::Duration wait_for_verdict) {
  absl::MutexLock lock(&mu_);
  me_ = me;
  rank_ = rank;
  wait_for_verdict_ = wait_for_verdict;
}

void WorkerMember::Decide(const MemberVerdict& verdict) {
  absl::MutexLock lock(&mu_);
  decided_ = verdict;
}

WorkerMember::State WorkerMember::Snapshot() {
  absl::MutexLock lock(&mu_);
  return State{client_, once_, instance_id_, me_, rank_, wait_for_verdict_, decided_};
}

MemberVerdict WorkerMember::VerdictAfterError(const absl::Status& error) {
  const State s = Snapshot();
  if (s.decided.has_value() && !IsPermanent(error)) return *s.decided;
  const MemberVerdict unknown{kMemberExitFailed, ""};
  if (s.client == nullptr) return unknown;
  if (s.me.job_id.empty()) {  // not registered: refused because the job is over?
    return VerdictAfterRegisterError(*s.client, error).value_or(unknown);
  }
  if (IsPermanent(error)) {
    const absl::Status reported = ReportPermanentFailure(
        *s.client, v1::ROLE_WORKER, s.rank, s.instance_id, error, PermanentErrorStep(error));
    if (!reported.ok()) {
      std::fprintf(stderr, "onebit-worker: cannot report the failure to the coordinator: %s\n",
                   reported.ToString().c_str());
    }
  }
  CoordinatorClient& ask = s.once != nullptr ? *s.once : *s.client;
  // A job that ends below the steps it leased ended where a worker's training loop did (a
  // job without steps, LeaseRequest.ended): this worker, which failed in a later step's
  // exchange, ran past it.
  absl::StatusOr<v1::JobStatus> job = ask.GetJob({});
  if (job.ok() && job->state() != v1::JOB_STATE_FAILED && job->stop_after_step() >= 0 &&
      job->stop_after_step() < job->max_lease_step()) {
    return MemberVerdict{
        kMemberExitFailed,
        absl::StrCat("the job ended after step ", job->stop_after_step(),
                     " while this worker still ran: its training loop ran past the others' "
                     "(every worker must run the same number of steps)")};
  }
  return AwaitVerdict(ask, s.me, s.wait_for_verdict).value_or(unknown);
}

int WorkerMember::ExitCodeAfterError(const absl::Status& error) {
  const MemberVerdict verdict = VerdictAfterError(error);
  if (!verdict.reason.empty()) std::fprintf(stderr, "onebit-worker: %s\n", verdict.reason.c_str());
  return verdict.exit_code;
}

void WorkerMember::ReportRestartableExit(const std::string& why, int64_t step) {
  const State s = Snapshot();
  if (s.once == nullptr || s.me.job_id.empty()) return;
  const absl::Status reported =
      ReportRestartableFailure(*s.once, v1::ROLE_WORKER, s.rank, s.instance_id, why, step);
  if (!reported.ok()) {
    std::fprintf(stderr, "onebit-worker: cannot tell the coordinator why this worker stops: %s\n",
                 reported.ToString().c_str());
  }
}

namespace {

// The health endpoint of this process, for the signal thread (null while there is none).
absl::Mutex g_health_mu(absl::kConstInit);
MetricsServer* g_health ABSL_GUARDED_BY(g_health_mu) = nullptr;

void PublishHealth(MetricsServer* server) {
  absl::MutexLock lock(&g_health_mu);
  g_health = server;
}

}  // namespace

void LeaveOnSignal(int sig) {
  {
    absl::MutexLock lock(&g_health_mu);
    if (g_health != nullptr) g_health->SetNotReady("shutting down");
  }
  std::fprintf(stderr, "onebit-worker: %s; leaving the job (exit 0)\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT");
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}

namespace {

absl::Duration RendezvousTimeout(const JobConfig& config) {
  return absl::Seconds(config.failure.rendezvous_timeout_s);
}

// The rendezvous keys of a collective group: per job, generation (a recovery rebuilds every
// communicator under new keys) and group.
std::string GroupPrefix(const v1::RegisterResponse& reg, const std::string& group) {
  return absl::StrCat(reg.job_id(), "/g", reg.generation(), "/", group);
}

// Waits until the coordinator knows every shard's address; in shard order.
absl::StatusOr<std::vector<std::string>> ShardAddresses(CoordinatorClient& client, int num_servers,
                                                        absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  for (;;) {
    ONEBIT_ASSIGN_OR_RETURN(v1::ListMembersResponse members, client.ListMembers({}));
    std::vector<std::string> addresses(num_servers);
    int found = 0;
    for (const v1::Member& m : members.members()) {
      if (m.role() == v1::ROLE_SERVER && m.rank() >= 0 && m.rank() < num_servers &&
          addresses[m.rank()].empty()) {
        addresses[m.rank()] = m.address();
        ++found;
      }
    }
    if (found == num_servers) return addresses;
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("only ", found, " of ", num_servers, " parameter servers registered in ",
                       absl::FormatDuration(timeout), " (onebit.failure.rendezvous_timeout_s)"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

// A collective group of this job over `comm`, "nccl" (device cuda) or "gloo": `group` names
// it among the job's groups ("world", "node3", "slice1") for the rendezvous keys.
absl::StatusOr<std::unique_ptr<Transport>> GroupTransport(const JobConfig& config,
                                                          const v1::RegisterResponse& reg,
                                                          const std::string& group, int rank,
                                                          int world_size,
                                                          std::shared_ptr<CoordinatorClient> store_client,
                                                          kernels::Backend* backend,
                                                          const std::string& comm,
                                                          const std::string& host) {
  if (comm == "nccl") {
    const std::string key = absl::StrCat(GroupPrefix(reg, group), "/nccl_unique_id");
    if (rank == 0) {
      ONEBIT_ASSIGN_OR_RETURN(NcclUniqueId id, NewNcclUniqueId());
      v1::KvSetRequest set;
      set.set_key(key);
      set.set_value(SerializeNcclUniqueId(id));
      ONEBIT_RETURN_IF_ERROR(store_client->KvSet(set).status());
    }
    v1::KvGetRequest get;
    get.set_key(key);
    get.set_wait(true);
    get.set_timeout_ms(static_cast<int64_t>(config.failure.rendezvous_timeout_s * 1000));
    ONEBIT_ASSIGN_OR_RETURN(v1::KvGetResponse got, store_client->KvGet(get));
    ONEBIT_ASSIGN_OR_RETURN(NcclUniqueId id, ParseNcclUniqueId(got.value()));
    return NcclTransport::Create(rank, world_size, id, backend);
  }
  auto store = std::make_shared<CoordinatorGlooStore>(
      store_client, GlooStorePrefix(GroupPrefix(reg, group), 0));
  GlooOptions options;
  options.hostname = host;
  options.timeout = absl::Seconds(config.failure.gloo_timeout_s);
  return GlooTransport::Create(store, rank, world_size, options);
}

// The group of every worker ("world", over comm_backend_name) in the backend's memory: peer
// mode, and ps mode's warmup between the workers. With `trace_path`, its calls go into
// w.trace (made here unless the ps exchange made it).
absl::StatusOr<std::unique_ptr<Transport>> WorldTransport(
    const JobConfig& config, const v1::RegisterResponse& reg,
    std::shared_ptr<CoordinatorClient> client, const std::string& trace_path, Worker& w) {
  // GPU workers over gloo: a StagedTransport, so the compression runs on the device.
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Transport> world,
                          GroupTransport(config, reg, "world", reg.rank(), reg.world_size(),
                                         std::move(client), w.backend.get(),
                                         config.optimizer.comm_backend_name, w.host));
  if (!trace_path.empty()) {
    if (w.trace == nullptr) {
      ONEBIT_ASSIGN_OR_RETURN(w.trace, CallTrace::Create(trace_path));
    }
    world = TracedTransport::Create(std::move(world), w.trace.get());
  }
  return InBackendMemory(w.backend.get(), std::move(world));
}

// The full-precision allreduce's options of the job (exchange.warmup_dtype, warmup_order).
absl::StatusOr<ExactAllreduceOptions> WarmupOptions(const JobConfig& config) {
  ExactAllreduceOptions exact;
  ONEBIT_ASSIGN_OR_RETURN(exact.wire_dtype, ParseWireDtype(config.exchange.warmup_dtype));
  ONEBIT_ASSIGN_OR_RETURN(exact.order, ParseSumOrder(EffectiveWarmupOrder(config.exchange)));
  return exact;
}

// The group of local rank `local_rank` on every node ("slice<l>"; this worker is rank
// `node` of `nodes`), over exchange.inter_transport, in the backend's memory.
absl::StatusOr<std::unique_ptr<Transport>> SliceTransport(
    const JobConfig& config, const v1::RegisterResponse& reg, int local_rank, int node, int nodes,
    std::shared_ptr<CoordinatorClient> client, kernels::Backend* backend,
    const std::string& host) {
  const std::string& between = config.exchange.inter_transport;
  ONEBIT_ASSIGN_OR_RETURN(
      std::unique_ptr<Transport> inter,
      GroupTransport(config, reg, absl::StrCat("slice", local_rank), node, nodes, std::move(client),
                     backend, between == "auto" ? config.optimizer.comm_backend_name : between,
                     host));
  return InBackendMemory(backend, std::move(inter));
}

// The hierarchical exchange of worker `rank`: its node's group, and between the nodes
// either a group of the same local rank on every node or that local rank's shards.
absl::StatusOr<std::unique_ptr<Exchange>> NewHierarchicalExchange(
    const JobConfig& config, const v1::RegisterResponse& reg, size_t n,
    std::shared_ptr<CoordinatorClient> client, kernels::Backend* backend,
    Worker& w) {
  const int local_size = config.exchange.local_size;
  const int node = reg.rank() / local_size, local_rank = reg.rank() % local_size;
  const int nodes = reg.world_size() / local_size;
  std::fprintf(stderr,
               "worker rank %d: node %d of %d, local rank %d of %d, between nodes: %s%s\n",
               reg.rank(), node, nodes, local_rank, local_size, config.exchange.inter.c_str(),
               config.exchange.shard_state ? ", optimizer state sharded in the node" : "");
  HierarchicalOptions options;
  options.shard_state = config.exchange.shard_state;
  options.node = node;
  ONEBIT_ASSIGN_OR_RETURN(w.transport, GroupTransport(config, reg, absl::StrCat("node", node),
                                                      local_rank, local_size, client, backend,
                                                      config.optimizer.comm_backend_name, w.host));
  std::unique_ptr<Exchange> between_nodes;
  if (config.exchange.inter == "ps") {
    const int k = config.exchange.servers / local_size;
    ONEBIT_ASSIGN_OR_RETURN(HierarchicalLayout layout, HierarchicalLayout::Create(n, local_size, k));
    ONEBIT_ASSIGN_OR_RETURN(std::vector<std::string> shards,
                            ShardAddresses(*client, reg.num_servers(), RendezvousTimeout(config)));
    std::vector<std::string> own(shards.begin() + local_rank * k,
                                 shards.begin() + (local_rank + 1) * k);
    ONEBIT_ASSIGN_OR_RETURN(between_nodes, PsExchange::Create(backend, node, nodes, layout.slice(),
                                                              own, PsOptions(config, own, w)));
    if (ShardsSkipWarmup(config.exchange)) {
      // exchange.warmup_over "workers": the slice's warmup sum between the nodes' workers of
      // this local rank (rank order, fp32: the shards' bits), the shards from the switch on.
      ONEBIT_ASSIGN_OR_RETURN(w.inter_transport, SliceTransport(config, reg, local_rank, node,
                                                                nodes, client, backend, w.host));
      ONEBIT_ASSIGN_OR_RETURN(
          between_nodes, WorkersWarmupExchange::Create(backend, w.inter_transport.get(),
                                                       layout.slice(), ExactAllreduceOptions(),
                                                       std::move(between_nodes)));
    }
    return HierarchicalExchange::Create(backend, w.transport.get(), std::move(between_nodes),
                                        layout, options);
  }
  ONEBIT_ASSIGN_OR_RETURN(w.inter_transport, SliceTransport(config, reg, local_rank, node, nodes,
                                                            client, backend, w.host));
  return HierarchicalExchange::CreatePeer(backend, w.transport.get(), w.inter_transport.get(), n,
                                          *w.codec, options);
}

// A stage's step time split (seconds over all its steps) as a JSON object.
std::string SplitJson(const StageTotals& t) {
  return absl::StrFormat(
      R"({"compute": %.6f, "compress": %.6f, "exchange": %.6f, "update": %.6f, "device_copy": %.6f})",
      t.compute_seconds, t.compress_seconds, t.exchange_seconds, t.update_seconds,
      t.device_copy_seconds);
}

// `job`: the job's status at the end (its recoveries), if the coordinator answered.
// peak_rss_bytes: the process's VmHWM now (0 where /proc has none), on a CPU worker the
// peak of everything; on a GPU worker host memory only.
absl::Status WriteSummary(const std::string& path, const JobConfig& config, int rank,
                          const TrainerSummary& s, double seconds, int64_t masked_elements,
                          const absl::StatusOr<v1::JobStatus>& job) {
  std::vector<int64_t> resumed;
  if (job.ok()) {
    for (const v1::Recovery& r : job->recovery_log()) resumed.push_back(r.resume_step());
  }
  const double accuracy = s.final_eval && s.final_eval->accuracy ? *s.final_eval->accuracy : -1;
  const double test_loss = s.final_eval ? s.final_eval->loss : -1;
  const std::string json = absl::StrFormat(
      R"({"rank": %d, "optimizer": "%s", "exchange": "%s", "warmup_steps": %d, "compression_steps": %d,
"first_compression_step": %d, "bytes_sent_warmup": %d, "bytes_sent_compression": %d,
"bytes_received_warmup": %d, "bytes_received_compression": %d,
"inter_node_bytes_sent_warmup": %d, "inter_node_bytes_sent_compression": %d,
"seconds_warmup": %.6f, "seconds_compression": %.6f, "last_loss": %.6g,
"test_loss": %.6g, "test_accuracy": %.6g, "samples": %d, "seconds": %.3f,
"steps_communicated_warmup": %d, "steps_communicated_compression": %d, "masked_elements": %d,
"recoveries": %d, "resumed_after_steps": [%s],
"device_bytes_to_host_warmup": %d, "device_bytes_from_host_warmup": %d,
"device_bytes_to_host_compression": %d, "device_bytes_from_host_compression": %d,
"split_warmup": %s, "split_compression": %s,
"optimizer_state_bytes": %d, "exchange_buffer_bytes": %d, "peak_rss_bytes": %d}
)",
      rank, Traits(config.optimizer.kind).name, config.exchange.mode, s.warmup.steps, s.compression.steps,
      s.first_compression_step, s.warmup.bytes_sent, s.compression.bytes_sent,
      s.warmup.bytes_received, s.compression.bytes_received, s.warmup.inter_node_bytes_sent,
      s.compression.inter_node_bytes_sent, s.warmup.seconds, s.compression.seconds, s.last_loss, test_loss, accuracy,
      s.last_step * config.micro_batch, seconds, s.warmup.steps_communicated,
      s.compression.steps_communicated, masked_elements, job.ok() ? job->recoveries() : -1,
      absl::StrJoin(resumed, ", "), s.warmup.device_bytes_to_host,
      s.warmup.device_bytes_from_host, s.compression.device_bytes_to_host,
      s.compression.device_bytes_from_host, SplitJson(s.warmup), SplitJson(s.compression),
      s.optimizer_state_bytes, s.exchange_buffer_bytes, PeakRssBytes());
  return WriteFileAtomically(path, json);
}

// The job's latest status as the worker's session heard it.
struct LastEvent {
  absl::Mutex mu;
  std::optional<v1::JobStatus> job ABSL_GUARDED_BY(mu);
};

// A worker that ran its last step stays a member until the job is over: another worker may
// still fail in the last steps, and the recovery restarts every member (the session's
// events Leave with 75) to run from the checkpoint again. Leaving at once, as workers once
// did, left nobody to rejoin, and the job failed at its end. Returns once the job
// succeeded; leaves when it recovers or failed. The events may lag (a stream that
// reconnects), so the coordinator is asked too, once a second (a job's workers end within
// a step of each other: at 1,024 workers a second or so of 1,024 calls); a coordinator gone
// for good ends the session (on_end).
absl::Status AwaitJobOver(CoordinatorClient& client, LastEvent& last, const MemberIdentity& me,
                          int rank, const std::function<void(const MemberVerdict&)>& on_verdict) {
  auto succeeded = [&last]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(last.mu) {
    return last.job.has_value() && last.job->state() == v1::JOB_STATE_SUCCEEDED;
  };
  for (;;) {
    {
      absl::MutexLock lock(&last.mu);
      if (last.mu.AwaitWithTimeout(absl::Condition(&succeeded), absl::Seconds(1))) {
        return absl::OkStatus();
      }
    }
    absl::StatusOr<v1::JobStatus> job = client.GetJob({});
    if (!job.ok()) continue;
    if (std::optional<MemberVerdict> verdict = VerdictFor(*job, me)) {
      Depart(on_verdict, rank, *verdict);
      return absl::AbortedError(verdict->reason);
    }
    if (job->state() == v1::JOB_STATE_SUCCEEDED) {
      absl::MutexLock lock(&last.mu);
      last.job = *job;
      return absl::OkStatus();
    }
  }
}

// The coordinator's client (w.client: retried for failure.coordinator_retry_s) and its
// one-attempt twin for the verdicts (member.h), with the process's TLS in w.tls.
absl::StatusOr<std::shared_ptr<CoordinatorClient>> ConnectToCoordinator(
    const WorkerProcessOptions& o, const JobConfig& config, Worker& w) {
  GrpcClientOptions client_options;
  client_options.address = o.coordinator;
  client_options.retry_for = absl::Seconds(config.failure.coordinator_retry_s);
  // A silent link (no RST, no FIN) breaks the connection within half the heartbeat timeout.
  client_options.keepalive = absl::Seconds(config.failure.heartbeat_timeout_s) / 4;
  client_options.tls = w.tls;
  ONEBIT_ASSIGN_OR_RETURN(client_options.token,
                          security::ResolveToken(o.member_token_file,
                                                 "ONEBIT_MEMBER_TOKEN",
                                                 config.security.member_token_file));
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> client,
                          NewGrpcCoordinatorClient(client_options));
  w.client = std::move(client);
  GrpcClientOptions once_options = client_options;
  once_options.retry_for = absl::ZeroDuration();
  once_options.max_attempts = 1;
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorClient> once,
                          NewGrpcCoordinatorClient(once_options));
  return std::shared_ptr<CoordinatorClient>(std::move(once));
}

// /metrics and the probes (not ready until training), published to the signal thread.
absl::Status StartProbes(const WorkerProcessOptions& o, const JobConfig& config, Worker& w) {
  const int port = o.metrics_port >= 0 ? o.metrics_port : config.ports.metrics;
  w.registry = std::make_shared<prometheus::Registry>();
  ONEBIT_ASSIGN_OR_RETURN(w.metrics, MetricsServer::Start(o.host, port));
  w.metrics->RegisterCollectable(w.registry);
  w.metrics->SetNotReady("registering with the coordinator");
  // At once, before registering: with --metrics_port=0 this line is the only thing that says
  // where the probes are until the coordinator lists the member.
  if (!o.quiet) {
    std::fprintf(stderr, "onebit-worker: /metrics, /healthz, /readyz on %s:%d\n",
                 o.host.c_str(), w.metrics->port());
  }
  PublishHealth(w.metrics.get());
  return absl::OkStatus();
}

// This worker's registration: who it is, its model's size and its config's terms. A mask
// from a .npy is read here where the model's size is known, so that the job terms carry what
// it masks and the workers' files are held to each other; *read_mask gets it (a file this
// worker cannot read says so in the terms, and fails the trainer's setup as before).
v1::RegisterRequest RegisterRequestFor(const WorkerProcessOptions& o, const JobConfig& config,
                                       const std::string& instance, int metrics_port,
                                       std::optional<std::vector<float>>* read_mask) {
  v1::RegisterRequest reg_request;
  reg_request.set_role(v1::ROLE_WORKER);
  reg_request.set_instance_id(instance);
  reg_request.set_address(o.host);
  reg_request.set_metrics_address(absl::StrCat(o.host, ":", metrics_port));
  reg_request.set_requested_rank(o.rank);
  if (o.num_parameters > 0) {
    reg_request.set_num_parameters(static_cast<int64_t>(o.num_parameters));
  } else if (absl::StatusOr<size_t> n = WorkloadParameterCount(config.workload); n.ok()) {
    reg_request.set_num_parameters(static_cast<int64_t>(*n));
  }
  std::string mask_summary;
  if (!config.momentum_mask.npy.empty() && reg_request.num_parameters() > 0) {
    absl::StatusOr<std::vector<float>> mask =
        MomentumMaskFromConfig(config, static_cast<size_t>(reg_request.num_parameters()));
    if (mask.ok()) {
      mask_summary = MomentumMaskSummary(*mask);
      *read_mask = *std::move(mask);
    } else {
      mask_summary = absl::StrCat("unreadable: ", mask.status().message());
    }
  }
  reg_request.set_job_terms(JobTerms(config, mask_summary));
  reg_request.set_job_key(o.job_key);
  reg_request.set_loaded_step(o.loaded_step);
  reg_request.set_loaded_freeze_step(o.loaded_freeze_step);
  return reg_request;
}

// The session that beats for this member and hears the job's events: an event that ends
// this member's part departs (Depart), and `last_event` keeps the latest status.
absl::Status StartSession(const WorkerProcessOptions& o, const JobConfig& config,
                          const v1::RegisterResponse& reg, const std::string& instance,
                          const MemberIdentity& me, std::shared_ptr<LastEvent> last_event,
                          Worker& w) {
  SessionOptions session;
  // Several heartbeats per detection window, so that one late beat is no death.
  session.heartbeat_interval =
      std::min(absl::Seconds(1), absl::Seconds(config.failure.heartbeat_timeout_s) / 4);
  session.role = v1::ROLE_WORKER;
  session.rank = reg.rank();
  session.instance_id = instance;
  const int my_rank = reg.rank();
  // The coordinator no longer knows this worker (it restarted since), or stayed out of
  // reach: leave with what the job says (member.h).
  session.give_up_after = absl::Seconds(config.failure.coordinator_retry_s);
  // Cut off (a silent link, noticed by the keepalive) for as long as the coordinator waits
  // for a heartbeat: it counts this worker dead and recovers without it, so leave (75)
  // instead of waiting in a collective for the transport's own timeout.
  session.silence_limit = absl::Seconds(config.failure.heartbeat_timeout_s) / 2;
  session.on_end = [client = w.client.get(), me, my_rank,
                    on_verdict = o.on_verdict](const absl::Status& why) {
    Depart(on_verdict, my_rank, VerdictAfterSessionEnd(*client, me, why));
  };
  ONEBIT_ASSIGN_OR_RETURN(
      w.session,
      w.client->StartSession(session, [me, my_rank, last_event,
                                       on_verdict = o.on_verdict](const v1::JobEvent& e) {
        if (std::optional<MemberVerdict> verdict = VerdictFor(e.job(), me)) {
          Depart(on_verdict, my_rank, *verdict);
        }
        absl::MutexLock lock(&last_event->mu);
        last_event->job = e.job();
      }));
  return absl::OkStatus();
}

// The backend and the workload (the config's, or the caller's) in w.
absl::Status BuildWorkload(const WorkerProcessOptions& o, const JobConfig& config,
                           const v1::RegisterResponse& reg, Worker& w) {
  if (config.device == "cuda") {
    ONEBIT_ASSIGN_OR_RETURN(w.backend, kernels::NewCudaBackend(o.cuda_device));
  } else {
    w.backend = kernels::NewCpuBackend(/*allow_simd=*/true, CpuThreads(o, config));
  }
  if (o.workload_factory) {
    ONEBIT_ASSIGN_OR_RETURN(w.workload, o.workload_factory(config, reg.rank(), reg.world_size(),
                                                           w.backend.get()));
  } else {
    ONEBIT_ASSIGN_OR_RETURN(w.workload,
                            NewWorkload(config, reg.rank(), reg.world_size(), w.backend.get()));
  }
  return absl::OkStatus();
}

// The exchange of the config's mode in w.exchange, with its transports. Returns the overlap
// of the warmup (exchange.overlap: peer mode, or ps with warmup_over "workers"), or null.
absl::StatusOr<OverlappedWarmup*> BuildExchange(const WorkerProcessOptions& o,
                                                const JobConfig& config,
                                                const v1::RegisterResponse& reg, size_t n,
                                                Worker& w) {
  OverlappedWarmup* overlap = nullptr;
  if (config.exchange.mode == "ps") {
    ONEBIT_ASSIGN_OR_RETURN(std::vector<std::string> shards,
                            ShardAddresses(*w.client, reg.num_servers(), RendezvousTimeout(config)));
    PsExchangeOptions ps = PsOptions(config, shards, w);
    if (!o.transport_trace.empty()) {
      ONEBIT_ASSIGN_OR_RETURN(w.trace, CallTrace::Create(o.transport_trace));
      ps.trace = w.trace.get();
    }
    // On a GPU too: the compression stays on the device, and only the blocks cross PCIe.
    ONEBIT_ASSIGN_OR_RETURN(w.exchange, PsExchange::Create(w.backend.get(), reg.rank(),
                                                           reg.world_size(), n, shards, ps));
    if (ShardsSkipWarmup(config.exchange)) {
      // exchange.warmup_over "workers": the warmup as in peer mode, over the workers' group.
      ONEBIT_ASSIGN_OR_RETURN(w.transport,
                              WorldTransport(config, reg, w.client, o.transport_trace, w));
      ONEBIT_ASSIGN_OR_RETURN(ExactAllreduceOptions exact, WarmupOptions(config));
      ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<WorkersWarmupExchange> workers,
                              WorkersWarmupExchange::Create(w.backend.get(), w.transport.get(), n,
                                                            exact, std::move(w.exchange)));
      if (config.exchange.overlap) overlap = &workers->overlap();
      w.exchange = std::move(workers);
    }
  } else if (config.exchange.mode == "hierarchical") {
    ONEBIT_ASSIGN_OR_RETURN(w.exchange, NewHierarchicalExchange(config, reg, n, w.client,
                                                                w.backend.get(), w));
  } else {
    ONEBIT_ASSIGN_OR_RETURN(w.transport,
                            WorldTransport(config, reg, w.client, o.transport_trace, w));
    ONEBIT_ASSIGN_OR_RETURN(ExactAllreduceOptions exact, WarmupOptions(config));
    ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PeerExchange> peer,
                            PeerExchange::Create(w.backend.get(), w.transport.get(), n, exact,
                                                 *w.codec));
    // The job config refuses overlap for GPU workers over gloo.
    if (config.exchange.overlap) overlap = &peer->overlap();
    w.exchange = std::move(peer);
  }
  return overlap;
}

// The step controller, the checkpointer and the trainer in w, over w.exchange (wrapped by
// --fault=kill_in_exchange).
absl::Status BuildTrainer(const WorkerProcessOptions& o, const JobConfig& config,
                          const v1::RegisterResponse& reg, const std::string& instance,
                          const std::optional<Fault>& fault,
                          std::optional<std::vector<float>> read_mask, OverlappedWarmup* overlap,
                          Worker& w) {
  const size_t n = w.workload->num_parameters();
  const int rank = reg.rank();
  if (fault.has_value() && fault->point == "kill_in_exchange") {
    w.fault_exchange = std::make_unique<FaultExchange>(w.exchange.get(), fault->step,
                                                       absl::StrCat("worker ", rank));
  }
  Exchange* exchange = w.fault_exchange ? w.fault_exchange.get() : w.exchange.get();
  w.controller = std::make_unique<CoordinatorStepController>(
      w.client.get(), w.session.get(), rank, config.log_every, exchange);
  TrainerOptions options = TrainerOptionsFromConfig(config);
  if (!o.evaluate) {
    options.eval_every = 0;
    options.eval_at_end = false;
  }
  options.overlap = overlap;
  if (read_mask.has_value() && read_mask->size() == n) {
    options.optimizer.momentum_mask = *std::move(read_mask);
  } else {
    ONEBIT_ASSIGN_OR_RETURN(options.optimizer.momentum_mask, MomentumMaskFromConfig(config, n));
  }
  options.optimizer.hyper_groups = o.hyper_groups;
  if (o.param_dtype != kernels::WireDtype::kFp32 && !o.workload_factory) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters in ", kernels::WireDtypeName(o.param_dtype),
        " come from an outside workload (a PyTorch model); the built-in ones are fp32"));
  }
  options.optimizer.param_dtype = o.param_dtype;
  if (!config.checkpoint.dir.empty()) {
    CheckpointerOptions c;
    c.dir = config.checkpoint.dir;
    c.rank = rank;
    c.world_size = reg.world_size();
    c.instance_id = instance;
    c.topology = checkpoint::TopologyKey(config);
    c.async = config.checkpoint.async;
    if (fault.has_value() && fault->point == "kill_before_commit") {
      c.before_commit = [fault, rank](int64_t step) {
        if (fault->At("kill_before_commit", step)) {
          KillSelf(absl::StrCat("worker ", rank),
                   absl::StrCat("step ", step, ", its checkpoint part written but not reported"));
        }
      };
    }
    w.checkpointer = std::make_unique<WorkerCheckpointer>(c, w.client.get());
    options.checkpoints = w.checkpointer.get();
  }
  options.print = [rank, quiet = o.quiet](absl::string_view line) {
    // Quiet: the trainer's warnings only (DivergenceWatch's), no progress.
    if (quiet && !absl::StartsWith(line, "warning:")) return;
    std::printf("rank %d  %.*s\n", rank, static_cast<int>(line.size()), line.data());
    std::fflush(stdout);
  };
  ONEBIT_ASSIGN_OR_RETURN(w.trainer, Trainer::Create(options, w.workload.get(), w.backend.get(),
                                                     exchange, w.controller.get(), w.sink.get()));
  return absl::OkStatus();
}

// Where the job starts: after the step of the states its workers loaded themselves
// (o.restore_loaded_state), from a checkpoint (RegisterResponse.resume), or at step 0.
absl::Status StartFromSavedState(const WorkerProcessOptions& o, const JobConfig& config,
                                 const v1::RegisterResponse& reg, Worker& w) {
  const int rank = reg.rank();
  if (reg.has_resume() && reg.resume().name().empty()) {
    // The job starts after the step of the states its workers loaded. A state that does
    // not fit is the same after any restart: the job fails at once, naming this worker
    // and why (not a silence taken for a lost process).
    if (o.loaded_step != reg.resume().step() || !o.restore_loaded_state) {
      return MarkPermanent(absl::FailedPreconditionError(absl::StrCat(
          "the job starts after step ", reg.resume().step(), " from its workers' saved states; "
          "this worker loaded ", o.loaded_step > 0 ? absl::StrCat("one of step ", o.loaded_step)
                                                   : std::string("none"))));
    }
    if (absl::Status restored = o.restore_loaded_state(*w.trainer, rank, reg.world_size());
        !restored.ok()) {
      return MarkPermanent(absl::Status(
          restored.code(), absl::StrCat("its loaded state: ", restored.message())));
    }
    std::fprintf(stderr, "worker rank %d: starts after step %d from its loaded state\n", rank,
                 static_cast<int>(o.loaded_step));
  } else if (reg.has_resume()) {
    if (o.loaded_step > 0) {
      std::fprintf(stderr, "worker rank %d: the job resumes from its checkpoint of step %d; the "
                   "loaded state of step %d is not used\n", rank,
                   static_cast<int>(reg.resume().step()), static_cast<int>(o.loaded_step));
    }
    const absl::Time restore_start = absl::Now();
    StateScalars trainer_scalars;
    ONEBIT_RETURN_IF_ERROR(RestoreWorker(config.checkpoint.dir, reg.resume(), rank,
                                         w.trainer->optimizer(), &trainer_scalars));
    ONEBIT_RETURN_IF_ERROR(w.trainer->RestoreScalars(trainer_scalars));
    std::fprintf(stderr, "worker rank %d: resumed from the checkpoint of step %d in %.1f ms%s\n",
                 rank, static_cast<int>(reg.resume().step()),
                 absl::ToDoubleMilliseconds(absl::Now() - restore_start),
                 reg.resume().reset_errors()
                     ? absl::StrCat(" (error buffers reset: ", reg.resume().reason(), ")").c_str()
                     : "");
  }
  return absl::OkStatus();
}

// After the job ended for this worker: the final parameters (o.params_out) and the summary
// (o.summary_file).
absl::Status WriteOutputs(const WorkerProcessOptions& o, const JobConfig& config, int rank,
                          const TrainerSummary& summary, absl::Time start, LastEvent& last_event,
                          Worker& w) {
  if (!o.params_out.empty()) {
    ONEBIT_ASSIGN_OR_RETURN(std::vector<float> params, w.trainer->optimizer().ParamsToHost());
    ONEBIT_RETURN_IF_ERROR(npy::WriteFloat32(o.params_out,
                                             {static_cast<int64_t>(params.size())}, params.data()));
  }
  if (!o.summary_file.empty()) {
    // The recoveries change only with the generation, which this worker's whole run was
    // in: the session's last event has them, without asking a coordinator that may have
    // ended with the job (and would be retried for coordinator_retry_s).
    absl::StatusOr<v1::JobStatus> job = absl::UnavailableError("no job event yet");
    {
      absl::MutexLock lock(&last_event.mu);
      if (last_event.job.has_value()) job = *last_event.job;
    }
    if (!job.ok()) job = w.client->GetJob({});
    ONEBIT_RETURN_IF_ERROR(WriteSummary(o.summary_file, config, rank, summary,
                                        absl::ToDoubleSeconds(absl::Now() - start),
                                        w.trainer->optimizer().masked_elements(), job));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWorkerProcess(const WorkerProcessOptions& o, WorkerMember* member) {
  const absl::Time start = absl::Now();
  if (o.config_path.empty() || o.coordinator.empty()) {
    return absl::InvalidArgumentError("--config and --coordinator are required");
  }
  if (member == nullptr) return absl::InvalidArgumentError("RunWorkerProcess: member is null");
  // Destroyed before `w` below (declared after it) on every way out.
  struct Teardown {
    const std::function<void()>* hook = nullptr;
    ~Teardown() {
      if (hook != nullptr && *hook) (*hook)();
    }
  };
  ONEBIT_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(o.config_path));
  Worker w;
  w.host = o.host;
  // An exchange.compressor that the config's parser took and no codec has: a config error.
  ONEBIT_ASSIGN_OR_RETURN(w.codec, FindCodec(config.exchange.compressor));
  ONEBIT_ASSIGN_OR_RETURN(w.tls, security::TlsFromFlags(config.security.tls));
  Teardown teardown{&o.before_teardown};
  ONEBIT_ASSIGN_OR_RETURN(std::shared_ptr<CoordinatorClient> once,
                          ConnectToCoordinator(o, config, w));
  ONEBIT_ASSIGN_OR_RETURN(std::optional<Fault> fault,
                          ParseFault(o.fault, {"kill_in_exchange", "kill_before_commit"}));
  if (o.check) {
    ONEBIT_RETURN_IF_ERROR(WorkloadParameterCount(config.workload).status());
    // A running job's notices are the coordinator's to print (once, not once per worker).
    for (const std::string& notice : config.notices) {
      std::fprintf(stderr, "onebit-worker: config notice: %s\n", notice.c_str());
    }
    std::printf("onebit-worker: flags and config OK (%s, %s exchange, %s)\n",
                config.workload.type.c_str(), config.exchange.mode.c_str(), config.device.c_str());
    return absl::OkStatus();
  }
  ONEBIT_RETURN_IF_ERROR(StartProbes(o, config, w));
  struct Unpublish {
    ~Unpublish() { PublishHealth(nullptr); }
  } unpublish;  // before w.metrics is destroyed

  // Register: the coordinator assigns the rank. A refusal's exit code asks the member.
  const std::string instance = InstanceId();
  std::optional<std::vector<float>> read_mask;
  const v1::RegisterRequest reg_request =
      RegisterRequestFor(o, config, instance, w.metrics->port(), &read_mask);
  member->Connected(w.client, std::move(once), instance);
  ONEBIT_ASSIGN_OR_RETURN(
      v1::RegisterResponse reg,
      RegisterReplacing(*w.client, reg_request,
                        absl::Seconds(config.failure.heartbeat_timeout_s) + absl::Seconds(10)));
  if (!o.quiet) {
    std::fprintf(stderr, "worker rank %d of %d (job %s)\n", reg.rank(), reg.world_size(),
                 reg.job_id().c_str());
  }
  w.metrics_sink = std::make_unique<WorkerMetrics>(
      *w.registry, std::map<std::string, std::string>{{"rank", absl::StrCat(reg.rank())}});
  w.metrics->SetNotReady("setting up the workload and the exchange");
  w.sink = std::make_unique<HistorySink>(w.metrics_sink.get(), o.history_csv);
  const MemberIdentity me{reg.job_id(), reg.generation(), /*leave_on_success=*/false};
  member->Registered(me, reg.rank(),
                     absl::Seconds(config.failure.heartbeat_timeout_s) + absl::Seconds(5));
  auto last_event = std::make_shared<LastEvent>();
  ONEBIT_RETURN_IF_ERROR(StartSession(o, config, reg, instance, me, last_event, w));

  // Set up, then train.
  ONEBIT_RETURN_IF_ERROR(BuildWorkload(o, config, reg, w));
  ONEBIT_ASSIGN_OR_RETURN(OverlappedWarmup* overlap,
                          BuildExchange(o, config, reg, w.workload->num_parameters(), w));
  ONEBIT_RETURN_IF_ERROR(
      BuildTrainer(o, config, reg, instance, fault, std::move(read_mask), overlap, w));
  ONEBIT_RETURN_IF_ERROR(StartFromSavedState(o, config, reg, w));
  if (o.before_run) ONEBIT_RETURN_IF_ERROR(o.before_run(*w.trainer));
  w.metrics->SetReady();  // registered, set up, training
  absl::StatusOr<TrainerSummary> ran = w.trainer->Run();
  if (!ran.ok() && MayBeAPeersFailure(ran.status())) {
    // A peer that died breaks this worker's exchange within milliseconds, and the
    // coordinator names the member that went silent first: were this worker's session to
    // end now, its last heartbeat would be older than the dead peer's about half the time
    // (a heartbeat interval is far longer than those milliseconds), and the recovery
    // would name this worker. So the verdict is awaited while the session still beats (a
    // job event that ends this worker's part exits from the session at once).
    member->Decide(member->VerdictAfterError(ran.status()));
  }
  ONEBIT_RETURN_IF_ERROR(ran.status());
  TrainerSummary summary = *std::move(ran);
  if (o.after_run) ONEBIT_RETURN_IF_ERROR(o.after_run(*w.trainer));

  // The end: the last checkpoint's part is written and reported before this worker goes,
  // and it stays a member until the job is over.
  w.metrics->SetNotReady("the job is over for this worker");
  if (w.checkpointer != nullptr) ONEBIT_RETURN_IF_ERROR(w.checkpointer->Flush());
  ONEBIT_RETURN_IF_ERROR(AwaitJobOver(*w.client, *last_event, me, reg.rank(), o.on_verdict));
  ONEBIT_RETURN_IF_ERROR(WriteOutputs(o, config, reg.rank(), summary, start, *last_event, w));
  (void)w.session->Stop();
  return absl::OkStatus();
}

}  // namespace onebit
