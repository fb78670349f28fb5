// onebit-worker: one worker of a job. Registers with the coordinator (which assigns the
// rank), builds the workload and the exchange the config asks for (peer over gloo or NCCL,
// the parameter-server shards, or hierarchical: a node group plus peer or shards between
// nodes), trains in the coordinator's leases, serves /metrics (and the probes /healthz and
// /readyz: ready once registered and training), and writes a summary for launchers.
//
//   onebit_worker --config=job.json --coordinator=127.0.0.1:PORT [--summary_file=F]
//
// TLS (--tls_ca/--tls_cert/--tls_key, or the config's onebit.security.tls) secures the
// channels to the coordinator and to the shards; the member token (--member_token_file,
// $ONEBIT_MEMBER_TOKEN or onebit.security.member_token_file) goes with every coordinator
// call. gloo's and NCCL's own links between workers are not covered (see README).
//
// SIGTERM or SIGINT: the worker leaves at once with exit 0 (an orchestrator stopping it):
// /readyz turns 503, the output is flushed, and the process ends without waiting for the
// step in flight, which may be blocked in a collective with a peer that is stopping too
// (every file it writes is written atomically; the coordinator notices the member gone as
// it notices any other, and a job that goes on recovers from its last checkpoint).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "common/signals.h"
#include "worker/worker_process.h"

ABSL_FLAG(std::string, config, "", "The job config (JSON, required).");
ABSL_FLAG(std::string, coordinator, "", "host:port of the coordinator's gRPC service (required).");
ABSL_FLAG(std::string, host, "127.0.0.1", "This worker's address (gloo, /metrics).");
ABSL_FLAG(int, metrics_port, -1, "Port of /metrics; -1: the config's, 0: a free one.");
ABSL_FLAG(std::string, summary_file, "", "Write a JSON summary here at the end.");
ABSL_FLAG(std::string, params_out, "", "Write the final parameters here (.npy).");
ABSL_FLAG(int, rank, -1, "Ask the coordinator for this rank (-1: the next free one).");
ABSL_FLAG(int, cuda_device, 0, "GPU to use with onebit.device = cuda.");
ABSL_FLAG(int, cpu_threads, -1,
          "Threads of the CPU kernels; -1: the config's onebit.cpu_threads (0: the usable CPUs, "
          "divided among LOCAL_WORLD_SIZE workers when a launcher sets it).");
ABSL_FLAG(bool, check, false,
          "Validate the flags and the config (and the TLS files and token they name), say so "
          "and exit 0, without connecting, binding a port or writing a file (deployment checks).");
ABSL_FLAG(std::string, fault, "",
          "Fault injection for tests: kill_in_exchange:STEP or kill_before_commit:STEP "
          "(SIGKILL at that point).");
ABSL_FLAG(std::string, member_token_file, "",
          "File holding the member token for the coordinator's calls; default: "
          "$ONEBIT_MEMBER_TOKEN, then onebit.security.member_token_file.");
ABSL_FLAG(std::string, history_csv, "",
          "Write every step (step,stage,loss,seconds,bytes_sent,compute_seconds,unix_time and "
          "the rest of the step's split: compress, exchange, update seconds) and evaluation "
          "here (CSV).");

ABSL_FLAG(std::string, transport_trace, "",
          "Peer and ps modes: write one CSV line per call of the job's transport (peer) or per "
          "push and result (ps) here (op, peers, "
          "bytes, start and end in unix seconds), to count a run's message rounds.");

namespace {

onebit::WorkerProcessOptions OptionsFromFlags() {
  onebit::WorkerProcessOptions o;
  o.config_path = absl::GetFlag(FLAGS_config);
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.host = absl::GetFlag(FLAGS_host);
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.summary_file = absl::GetFlag(FLAGS_summary_file);
  o.params_out = absl::GetFlag(FLAGS_params_out);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  o.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  o.check = absl::GetFlag(FLAGS_check);
  o.fault = absl::GetFlag(FLAGS_fault);
  o.member_token_file = absl::GetFlag(FLAGS_member_token_file);
  o.history_csv = absl::GetFlag(FLAGS_history_csv);
  o.transport_trace = absl::GetFlag(FLAGS_transport_trace);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  onebit::IgnoreSigpipe();
  // Before any thread starts, so that every thread inherits the blocked signals.
  onebit::TerminationWatcher signals(&onebit::LeaveOnSignal);
  absl::ParseCommandLine(argc, argv);
  onebit::WorkerMember member;
  const absl::Status status = onebit::RunWorkerProcess(OptionsFromFlags(), &member);
  if (!status.ok()) {
    std::fprintf(stderr, "onebit-worker: error: %s\n", status.ToString().c_str());
    if (status.code() == absl::StatusCode::kInvalidArgument) return 2;
    return member.ExitCodeAfterError(status);
  }
  return 0;
}
