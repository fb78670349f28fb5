#include "deploy/local_job.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "common/status_macros.h"

namespace onebit::launcher {

using google::protobuf::Value;

absl::StatusOr<Value> ParseJsonValue(const std::string& text, const std::string& what) {
  Value v;
  const auto s = google::protobuf::util::JsonStringToMessage(text, &v);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message().as_string()));
  return v;
}

double NumberField(const Value& v, const std::string& key) {
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(key);
  if (it == fields.end()) return 0.0;
  // Protobuf's JSON mapping writes 64-bit integers as strings.
  if (it->second.kind_case() == Value::kStringValue) {
    double x = 0;
    return absl::SimpleAtod(it->second.string_value(), &x) ? x : 0.0;
  }
  return it->second.number_value();
}

std::string StringField(const Value& v, const std::string& key) {
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(key);
  return it == fields.end() ? "" : it->second.string_value();
}

absl::StatusOr<std::vector<ClusterHost>> ParseClusterHosts(const std::string& text) {
  std::vector<ClusterHost> hosts;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, '@');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a cluster host is NAMESPACE@ADDRESS, got '", item, "'"));
    }
    hosts.push_back({parts[0], parts[1]});
  }
  return hosts;
}

absl::StatusOr<Process*> LocalJob::Spawn(const std::string& name, std::vector<std::string> argv,
                                         const ClusterHost& host, bool echo) {
  argv.push_back("--host=" + host.address);
  if (!host.netns.empty()) argv.insert(argv.begin(), {"/sbin/ip", "netns", "exec", host.netns});
  ProcessOptions process;
  process.argv = std::move(argv);
  process.name = name;
  process.echo = echo;
  process.log_path =
      absl::StrCat(options_.dir, "/", absl::StrReplaceAll(name, {{" ", "-"}}), ".log");
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Process> p, Process::Start(process));
  processes_.push_back(std::move(p));
  return processes_.back().get();
}

absl::Status LocalJob::Start() {
  std::error_code error;
  std::filesystem::create_directories(options_.dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", options_.dir, ": ", error.message()));
  }
  const std::string& bin = options_.bin_dir;
  const bool echo = options_.echo_all;
  const std::string addr_file = options_.dir + "/coordinator.addr";
  std::vector<std::string> argv = {bin + "/coordinator/onebit-coordinator",
                                   "--config=" + options_.config_path, "--address_file=" + addr_file};
  argv.insert(argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  if (!options_.nodes.empty() && config_.workers % options_.nodes.size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_.workers, " workers do not spread evenly over ", options_.nodes.size(), " nodes"));
  }
  ONEBIT_ASSIGN_OR_RETURN(Process * coordinator,
                          Spawn("coordinator", argv, options_.control, echo));
  ONEBIT_ASSIGN_OR_RETURN(std::string text, WaitForFile(addr_file, absl::Seconds(30), coordinator));
  ONEBIT_ASSIGN_OR_RETURN(Value addr, ParseJsonValue(text, addr_file));
  grpc_ = StringField(addr, "grpc");
  rest_ = StringField(addr, "rest");
  metrics_ = StringField(addr, "metrics");

  if (UsesServers(config_.exchange)) {
    for (int s = 0; s < config_.exchange.servers; ++s) {
      const std::string file = absl::StrCat(options_.dir, "/server-", s, ".addr");
      ONEBIT_ASSIGN_OR_RETURN(
          Process * server,
          Spawn(absl::StrCat("server ", s),
                {bin + "/server/onebit-server", "--config=" + options_.config_path,
                 "--coordinator=" + grpc_, absl::StrCat("--shard=", s), "--address_file=" + file},
                options_.control, echo));
      ONEBIT_RETURN_IF_ERROR(WaitForFile(file, absl::Seconds(30), server).status());
    }
  }
  for (int i = 0; i < config_.workers; ++i) {
    std::vector<std::string> w = {bin + "/worker/onebit-worker", "--config=" + options_.config_path,
                                  "--coordinator=" + grpc_,
                                  absl::StrCat("--summary_file=", options_.dir, "/worker-", i, ".json"),
                                  // Worker i is rank i, so that logs and files line up across runs.
                                  absl::StrCat("--rank=", i)};
    for (const std::string& flag : options_.worker_flags) {
      w.push_back(absl::StrReplaceAll(flag, {{"{i}", absl::StrCat(i)}}));
    }
    const ClusterHost& host =
        options_.nodes.empty()
            ? options_.control
            : options_.nodes[i / (config_.workers / static_cast<int>(options_.nodes.size()))];
    ONEBIT_ASSIGN_OR_RETURN(Process * worker,
                            Spawn(absl::StrCat("worker ", i), w, host, echo || i == 0));
    workers_.push_back(worker);
  }
  return absl::OkStatus();
}

absl::Status LocalJob::WaitForWorkers(absl::Duration timeout, const volatile int* interrupted) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    size_t done = 0;
    for (auto& p : processes_) {
      int code = 0;
      if (!p->Exited(&code)) continue;
      // The coordinator exits 0 by itself once every worker reported its last step.
      if (code != 0) {
        return absl::AbortedError(absl::StrCat(p->name(), " exited with code ", code,
                                               "; its log is in ", options_.dir));
      }
      if (std::find(workers_.begin(), workers_.end(), p.get()) != workers_.end()) ++done;
    }
    if (done == workers_.size()) return absl::OkStatus();
    if (interrupted && *interrupted) return absl::CancelledError("interrupted");
    if (absl::Now() > deadline) return absl::DeadlineExceededError("the job took too long");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

void LocalJob::Stop() {
  // Workers first, then the shards, then the coordinator.
  for (auto it = processes_.rbegin(); it != processes_.rend(); ++it) (*it)->Terminate();
}

absl::StatusOr<std::vector<Value>> LocalJob::Summaries() const {
  std::vector<Value> out;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const std::string path = absl::StrCat(options_.dir, "/worker-", i, ".json");
    ONEBIT_ASSIGN_OR_RETURN(std::string text, WaitForFile(path, absl::Seconds(5)));
    ONEBIT_ASSIGN_OR_RETURN(Value v, ParseJsonValue(text, path));
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace onebit::launcher
