// A whole onebit job on this machine as real processes on loopback: one coordinator, the
// parameter-server shards (ps mode), the workers. The launcher and the multi-process tests
// run jobs through this.
//
// Thread safety: one thread at a time.
#ifndef ONEBIT_DEPLOY_LOCAL_JOB_H_
#define ONEBIT_DEPLOY_LOCAL_JOB_H_

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

struct LocalJobOptions {
  std::string bin_dir;      // holds coordinator/onebit-coordinator, server/..., worker/...
  std::string dir;          // logs, address files, summaries (created)
  std::string config_path;  // the job config every process reads
  bool echo_all = true;     // print every process's output (else only the first worker's)
  // Extra flags for worker i (e.g. --params_out=...); "{i}" is replaced by i.
  std::vector<std::string> worker_flags;
  std::vector<std::string> coordinator_flags;
  // Where the processes run (`ip netns exec`, root): the coordinator and the shards on
  // `control`, worker i on nodes[i / (workers / nodes.size())] (ranks are node-major, as
  // the hierarchical exchange expects). No nodes: every worker on `control`.
  ClusterHost control;
  std::vector<ClusterHost> nodes;
};

class LocalJob {
 public:
  LocalJob(const LocalJobOptions& options, const JobConfig& config)
      : options_(options), config_(config) {}

  // Starts the coordinator, waits for its address file, then the shards (each registered
  // once its address file exists), then the workers.
  absl::Status Start();
  // Waits until every worker exits 0. Fails at once when any process exits with another
  // code, after `timeout`, or when *interrupted is set.
  absl::Status WaitForWorkers(absl::Duration timeout, const volatile int* interrupted = nullptr);
  // Terminates whatever still runs (SIGTERM, then SIGKILL).
  void Stop();

  // After Start: the coordinator's addresses, host:port.
  const std::string& grpc_address() const { return grpc_; }
  const std::string& rest_address() const { return rest_; }
  const std::string& metrics_address() const { return metrics_; }

  // After WaitForWorkers: worker i's summary (the JSON its --summary_file holds).
  absl::StatusOr<std::vector<google::protobuf::Value>> Summaries() const;

 private:
  // Starts argv on `host` (its namespace, --host=its address appended).
  absl::StatusOr<Process*> Spawn(const std::string& name, std::vector<std::string> argv,
                                 const ClusterHost& host, bool echo);

  LocalJobOptions options_;
  JobConfig config_;
  std::string grpc_, rest_, metrics_;
  std::vector<std::unique_ptr<Process>> processes_;
  std::vector<Process*> workers_;
};

// JSON text into a google.protobuf.Value; `what` names the source in errors.
absl::StatusOr<google::protobuf::Value> ParseJsonValue(const std::string& text,
                                                       const std::string& what);
// A field of a JSON object (0 / "" when absent). NumberField also reads numbers written
// as strings, as protobuf does for 64-bit integers.
double NumberField(const google::protobuf::Value& v, const std::string& key);
std::string StringField(const google::protobuf::Value& v, const std::string& key);

}  // namespace onebit::launcher

#endif  // ONEBIT_DEPLOY_LOCAL_JOB_H_
