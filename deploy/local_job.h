// A whole onebit job on this machine as real processes on loopback: one coordinator, the
// parameter-server shards (ps mode), the workers. The launcher and the multi-process tests
// run jobs through this.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_DEPLOY_LOCAL_JOB_H_
#define ONEBIT_DEPLOY_LOCAL_JOB_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "google/protobuf/struct.pb.h"

namespace onebit::launcher {

// A host of an emulated cluster (tools/emulated_cluster.sh): a network namespace and the
// address the processes there bind to. An empty netns is this namespace on 127.0.0.1.
struct ClusterHost {
  std::string netns;
  std::string address = "127.0.0.1";
};

// "NAME@ADDRESS" or "NAME@ADDRESS,NAME@ADDRESS,...".
absl::StatusOr<std::vector<ClusterHost>> ParseClusterHosts(const std::string& text);

struct LocalJobOptions;
// The --cluster_control and --cluster_nodes flags (what `tools/emulated_cluster.sh up`
// prints) into `options`: one control host (empty: unchanged) and the workers' hosts.
absl::Status SetClusterHosts(const std::string& control, const std::string& nodes,
                             LocalJobOptions* options);

struct LocalJobOptions {
  std::string bin_dir;      // holds coordinator/onebit-coordinator, server/..., worker/...
  std::string dir;          // logs, address files, summaries (created)
  std::string config_path;  // the job config every process reads
  bool echo_all = true;     // print every process's output (else only the first worker's)
  // Extra flags for worker i (e.g. --params_out=...); "{i}" is replaced by i.
  std::vector<std::string> worker_flags;
  std::vector<std::string> coordinator_flags;
  // Flags for one worker (by rank) or one shard (by index) only, e.g. a --fault (a training
  // script's worker gets its --fault as ONEBIT_FAULT, and only the first run of each).
  std::map<int, std::vector<std::string>> flags_of_worker;
  std::map<int, std::vector<std::string>> flags_of_server;
  // Where the processes run (`ip netns exec`, root): the coordinator and the shards on
  // `control`, worker i on nodes[i / (workers / nodes.size())] (ranks are node-major, as
  // the hierarchical exchange expects). No nodes: every worker on `control`.
  ClusterHost control;
  std::vector<ClusterHost> nodes;
  // Shard s on nodes[s % nodes.size()] instead of on `control`: a shard beside each
  // worker (BytePS's colocated placement, a DaemonSet). Needs nodes.
  bool shards_on_nodes = false;
  // Restart a process that died of a signal (kill -9) or exited with 75 (the job recovers:
  // "restart me"), as compose's `restart: on-failure` and Kubernetes would; at most this
  // many times per process. -1: the config's onebit.failure.max_restarts + 1.
  int max_restarts_per_process = -1;
  // A training script instead of onebit-worker (onebit-launch ... -- python3 train.py):
  // each worker runs this argv (argv[0] a path) with the job in its environment,
  //   ONEBIT_CONFIG, ONEBIT_COORDINATOR, ONEBIT_RANK (= i), ONEBIT_HOST,
  //   ONEBIT_SUMMARY_FILE (<dir>/worker-i.json), ONEBIT_HISTORY_CSV (<dir>/worker-i.csv),
  // plus `worker_env` ("NAME=value"); worker_flags do not apply. Empty: onebit-worker.
  std::vector<std::string> worker_command;
  std::vector<std::string> worker_env;
};

class LocalJob {
 public:
  LocalJob(const LocalJobOptions& options, const JobConfig& config)
      : options_(options), config_(config) {}

  // Starts the coordinator, waits for its address file, then the shards (each registered
  // once its address file exists), then the workers.
  absl::Status Start();
  // Waits until every worker exits 0, restarting processes that die (see
  // max_restarts_per_process; a restarted process loses its --fault flag, and a restarted
  // coordinator gets the ports the first one bound). Fails at once when a process exits
  // with another code or runs out of restarts, after `timeout`, or when *interrupted is set.
  // `each_poll`, when set, is called on this thread every poll (~50 ms): a fault injector
  // (tools/chaos) acts on the job there.
  absl::Status WaitForWorkers(absl::Duration timeout, const volatile int* interrupted = nullptr,
                              const std::function<void()>& each_poll = nullptr);
  // Terminates whatever still runs (SIGTERM, then SIGKILL).
  void Stop();

  // After Start: the coordinator's addresses, host:port.
  const std::string& grpc_address() const { return grpc_; }
  const std::string& rest_address() const { return rest_; }
  const std::string& metrics_address() const { return metrics_; }

  // After WaitForWorkers: worker i's summary (the JSON its --summary_file holds).
  absl::StatusOr<std::vector<google::protobuf::Value>> Summaries() const;

  // Restarts so far, by process name ("worker 1", "server 0", "coordinator").
  const std::map<std::string, int>& restarts() const { return restarts_; }
  // Sends `sig` to the process named `name` (tests inject faults this way too).
  absl::Status SignalProcess(const std::string& name, int sig);
  // Every process by name ("coordinator", "server 0", ..., "worker 0", ...), in start
  // order, with the host it runs on.
  std::vector<std::pair<std::string, ClusterHost>> Hosts() const;
  // The process named `name` runs (it started and has not exited, or was restarted).
  bool Running(const std::string& name);
  // Workers that exited 0 (their last step done), as of WaitForWorkers' latest poll.
  int workers_done() const { return workers_done_; }
  // Waits for the process named `name` to exit; its exit code.
  absl::StatusOr<int> WaitForProcess(const std::string& name, absl::Duration timeout);

 private:
  // Starts argv on `host` (its namespace, --host=its address appended; with `env`, the
  // environment entries of a training script instead, which takes no flags).
  absl::StatusOr<Process*> Spawn(const std::string& name, std::vector<std::string> argv,
                                 const ClusterHost& host, bool echo,
                                 std::vector<std::string> env = {});

  // How a process was started, to start it again.
  struct Spec {
    std::string name;
    std::vector<std::string> argv;
    ClusterHost host;
    bool echo = false;
    std::vector<std::string> env;  // ProcessOptions::env_set
  };
  absl::StatusOr<Process*> Respawn(size_t index);
  std::string LogPath(const std::string& name) const;

  LocalJobOptions options_;
  JobConfig config_;
  std::string grpc_, rest_, metrics_;
  std::vector<std::unique_ptr<Process>> processes_;
  std::vector<Spec> specs_;  // parallel to processes_
  std::vector<size_t> workers_;  // indices into processes_
  std::map<std::string, int> restarts_;
  int workers_done_ = 0;
};

// The folder of onebit's binaries for a tool run as argv0: `given` where it is not empty
// (a --bin_dir flag), else the tool's runfiles tree: $RUNFILES_DIR/onebit under `bazel
// run` and `bazel test`, else argv0.runfiles/onebit.
std::string BinDir(const std::string& given, const char* argv0);

// The last non-empty line of a log file (within its last 4 KiB), "" when there is none or
// it cannot be read: the line a failing process ended with, usually its error.
std::string LastLogLine(const std::string& path);

// JSON text into a google.protobuf.Value; `what` names the source in errors.
absl::StatusOr<google::protobuf::Value> ParseJsonValue(const std::string& text,
                                                       const std::string& what);
// A field of a JSON object (0 / "" when absent). NumberField also reads numbers written
// as strings, as protobuf does for 64-bit integers.
double NumberField(const google::protobuf::Value& v, const std::string& key);
std::string StringField(const google::protobuf::Value& v, const std::string& key);
// A list of integers (a summary's resumed_after_steps); empty when absent.
std::vector<int64_t> IntegerListField(const google::protobuf::Value& v, const std::string& key);

}  // namespace onebit::launcher

#endif  // ONEBIT_DEPLOY_LOCAL_JOB_H_
