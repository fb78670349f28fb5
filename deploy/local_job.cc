#include "deploy/local_job.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "common/parallel.h"
#include "common/permanent_error.h"
#include "common/status_macros.h"

namespace onebit::launcher {

// A member's exit codes (coordinator/member.h) for "the job recovers: restart me" and
// "the job failed: do not restart".
constexpr int kExitRestart = 75;
constexpr int kExitJobFailed = 78;

std::vector<std::string> WithFlags(std::vector<std::string> argv,
                                   const std::map<int, std::vector<std::string>>& flags, int index) {
  auto it = flags.find(index);
  if (it != flags.end()) argv.insert(argv.end(), it->second.begin(), it->second.end());
  return argv;
}

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

std::vector<int64_t> IntegerListField(const Value& v, const std::string& key) {
  std::vector<int64_t> out;
  const auto& fields = v.struct_value().fields();
  auto it = fields.find(key);
  if (it == fields.end()) return out;
  for (const Value& x : it->second.list_value().values()) {
    out.push_back(static_cast<int64_t>(x.number_value()));
  }
  return out;
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

absl::Status SetClusterHosts(const std::string& control, const std::string& nodes,
                             LocalJobOptions* options) {
  if (!control.empty()) {
    ONEBIT_ASSIGN_OR_RETURN(std::vector<ClusterHost> hosts, ParseClusterHosts(control));
    if (hosts.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("the control host is one NAMESPACE@ADDRESS, got '", control, "'"));
    }
    options->control = hosts[0];
  }
  ONEBIT_ASSIGN_OR_RETURN(options->nodes, ParseClusterHosts(nodes));
  return absl::OkStatus();
}

// Where a process's output goes: <dir>/<name with dashes>.log ("worker 1" -> worker-1.log).
std::string LocalJob::LogPath(const std::string& name) const {
  return absl::StrCat(options_.dir, "/", absl::StrReplaceAll(name, {{" ", "-"}}), ".log");
}

std::string BinDir(const std::string& given, const char* argv0) {
  if (!given.empty()) return given;
  if (const char* dir = std::getenv("RUNFILES_DIR")) return absl::StrCat(dir, "/onebit");
  return absl::StrCat(argv0, ".runfiles/onebit");
}

// The failing process's last line goes into the launcher's error (a Python traceback's
// exception, a binary's status), so the user need not open the log to read it.
std::string LastLogLine(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  tail.resize(static_cast<size_t>(in.gcount()));
  std::vector<absl::string_view> lines = absl::StrSplit(tail, '\n', absl::SkipWhitespace());
  return lines.empty() ? "" : std::string(absl::StripAsciiWhitespace(lines.back()));
}

absl::StatusOr<Process*> LocalJob::Spawn(const std::string& name, std::vector<std::string> argv,
                                         const ClusterHost& host, bool echo,
                                         std::vector<std::string> env) {
  if (env.empty()) argv.push_back("--host=" + host.address);
  if (!host.netns.empty()) argv.insert(argv.begin(), {"/sbin/ip", "netns", "exec", host.netns});
  ProcessOptions process;
  process.argv = std::move(argv);
  process.name = name;
  process.echo = echo;
  process.env_set = env;
  process.log_path = LogPath(name);
  ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Process> p, Process::Start(process));
  processes_.push_back(std::move(p));
  specs_.push_back(Spec{name, process.argv, host, echo, std::move(env)});
  return processes_.back().get();
}

absl::StatusOr<Process*> LocalJob::Respawn(size_t index) {
  Spec& spec = specs_[index];
  std::vector<std::string> argv;
  for (const std::string& arg : spec.argv) {
    if (absl::StartsWith(arg, "--fault=")) continue;  // a fault fires once
    argv.push_back(arg);
  }
  spec.argv = argv;
  spec.env.erase(std::remove_if(spec.env.begin(), spec.env.end(),
                                [](const std::string& e) { return absl::StartsWith(e, "ONEBIT_FAULT="); }),
                 spec.env.end());
  ProcessOptions process;
  process.argv = std::move(argv);
  process.name = spec.name;
  process.echo = spec.echo;
  process.env_set = spec.env;
  process.log_path = LogPath(spec.name);
  ONEBIT_ASSIGN_OR_RETURN(processes_[index], Process::Start(process));
  return processes_[index].get();
}

absl::StatusOr<int> LocalJob::WaitForProcess(const std::string& name, absl::Duration timeout) {
  for (auto& p : processes_) {
    if (p->name() == name) return p->Wait(timeout);
  }
  return absl::NotFoundError(absl::StrCat("no process named '", name, "'"));
}

absl::Status LocalJob::SignalProcess(const std::string& name, int sig) {
  for (auto& p : processes_) {
    if (p->name() == name) {
      p->Signal(sig);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("no process named '", name, "'"));
}

std::vector<std::pair<std::string, ClusterHost>> LocalJob::Hosts() const {
  std::vector<std::pair<std::string, ClusterHost>> hosts;
  for (const Spec& spec : specs_) hosts.emplace_back(spec.name, spec.host);
  return hosts;
}

bool LocalJob::Running(const std::string& name) {
  for (auto& p : processes_) {
    int code = 0;
    if (p->name() == name) return !p->Exited(&code);
  }
  return false;
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
  // The state file lets a restarted coordinator keep the job (id, generation).
  std::vector<std::string> argv = {bin + "/coordinator/onebit-coordinator",
                                   "--config=" + options_.config_path, "--address_file=" + addr_file,
                                   "--state_file=" + options_.dir + "/coordinator-state.json"};
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
  // A restarted coordinator must be found where the first one was.
  auto port_of = [](const std::string& hostport) { return hostport.substr(hostport.rfind(':') + 1); };
  for (auto [flag, address] : {std::pair<const char*, const std::string*>{"--port=", &grpc_},
                               {"--rest_port=", &rest_},
                               {"--metrics_port=", &metrics_}}) {
    if (!address->empty()) specs_[0].argv.push_back(flag + port_of(*address));
  }

  // Every process is on this machine (namespaces share its CPUs): unless the config says
  // otherwise, the kernels of the shards and workers share the usable CPUs out evenly
  // rather than each taking all of them.
  std::vector<std::string> threads_flag;
  if (config_.cpu_threads == 0) {
    const int processes = config_.workers + (UsesServers(config_.exchange) ? config_.exchange.servers : 0);
    threads_flag.push_back(absl::StrCat("--cpu_threads=", std::max(1, UsableCpus() / processes)));
  }
  if (UsesServers(config_.exchange)) {
    for (int s = 0; s < config_.exchange.servers; ++s) {
      const std::string file = absl::StrCat(options_.dir, "/server-", s, ".addr");
      std::vector<std::string> server_argv = {bin + "/server/onebit-server",
                                       "--config=" + options_.config_path, "--coordinator=" + grpc_,
                                       absl::StrCat("--shard=", s), "--address_file=" + file};
      server_argv.insert(server_argv.end(), threads_flag.begin(), threads_flag.end());
      ONEBIT_ASSIGN_OR_RETURN(Process * server,
                              Spawn(absl::StrCat("server ", s),
                                    WithFlags(std::move(server_argv), options_.flags_of_server, s),
                                    options_.shards_on_nodes && !options_.nodes.empty()
                                        ? options_.nodes[s % options_.nodes.size()]
                                        : options_.control,
                                    echo));
      // A shard serves once it knows the model's size. Where the workers' model decides
      // it (a PyTorch job's workload.parameters 0), that is after they registered: start
      // them without waiting.
      if (config_.workload.parameters > 0) {
        ONEBIT_RETURN_IF_ERROR(WaitForFile(file, absl::Seconds(30), server).status());
      }
    }
  }
  // Workers per host: every worker on one machine, or the emulated nodes' equal shares.
  const int per_host = options_.nodes.empty()
                           ? config_.workers
                           : config_.workers / static_cast<int>(options_.nodes.size());
  for (int i = 0; i < config_.workers; ++i) {
    const ClusterHost& host = options_.nodes.empty() ? options_.control : options_.nodes[i / per_host];
    if (!options_.worker_command.empty()) {
      // What torchrun would say, in onebit's own variables (python/onebit/env.py).
      std::vector<std::string> env = {
          "ONEBIT_CONFIG=" + options_.config_path,
          "ONEBIT_COORDINATOR=" + grpc_,
          absl::StrCat("ONEBIT_RANK=", i),
          absl::StrCat("ONEBIT_WORLD_SIZE=", config_.workers),
          absl::StrCat("ONEBIT_LOCAL_RANK=", i % per_host),
          absl::StrCat("ONEBIT_LOCAL_WORLD_SIZE=", per_host),
          "ONEBIT_HOST=" + host.address,
          absl::StrCat("ONEBIT_SUMMARY_FILE=", options_.dir, "/worker-", i, ".json"),
          absl::StrCat("ONEBIT_HISTORY_CSV=", options_.dir, "/worker-", i, ".csv")};
      env.insert(env.end(), options_.worker_env.begin(), options_.worker_env.end());
      // A script takes no flags: its --fault goes in ONEBIT_FAULT (read by python/onebit/_job.py).
      if (auto flags = options_.flags_of_worker.find(i); flags != options_.flags_of_worker.end()) {
        for (absl::string_view flag : flags->second) {
          if (absl::ConsumePrefix(&flag, "--fault=")) {
            env.push_back(absl::StrCat("ONEBIT_FAULT=", flag));
          }
        }
      }
      ONEBIT_RETURN_IF_ERROR(Spawn(absl::StrCat("worker ", i), options_.worker_command, host,
                                   echo || i == 0, std::move(env))
                                 .status());
      workers_.push_back(processes_.size() - 1);
      continue;
    }
    std::vector<std::string> w = {bin + "/worker/onebit-worker", "--config=" + options_.config_path,
                                  "--coordinator=" + grpc_,
                                  absl::StrCat("--summary_file=", options_.dir, "/worker-", i, ".json"),
                                  // Worker i is rank i, so that logs and files line up across runs.
                                  absl::StrCat("--rank=", i)};
    w.insert(w.end(), threads_flag.begin(), threads_flag.end());
    for (const std::string& flag : options_.worker_flags) {
      w.push_back(absl::StrReplaceAll(flag, {{"{i}", absl::StrCat(i)}}));
    }
    w = WithFlags(std::move(w), options_.flags_of_worker, i);
    ONEBIT_ASSIGN_OR_RETURN(Process * worker,
                            Spawn(absl::StrCat("worker ", i), w, host, echo || i == 0));
    (void)worker;
    workers_.push_back(processes_.size() - 1);
  }
  return absl::OkStatus();
}

absl::Status LocalJob::WaitForWorkers(absl::Duration timeout, const volatile int* interrupted,
                                      const std::function<void()>& each_poll) {
  const absl::Time deadline = absl::Now() + timeout;
  const int max_restarts = options_.max_restarts_per_process >= 0
                               ? options_.max_restarts_per_process
                               : config_.failure.max_restarts + 1;
  for (;;) {
    size_t done = 0;
    for (size_t i = 0; i < processes_.size(); ++i) {
      int code = 0;
      if (!processes_[i]->Exited(&code)) continue;
      const bool is_worker = std::find(workers_.begin(), workers_.end(), i) != workers_.end();
      if (code == 0) {
        // The coordinator and the shards exit 0 by themselves once the job succeeded.
        if (is_worker) ++done;
        continue;
      }
      const std::string name = specs_[i].name;
      // Died of a signal (128 + N), or asked to be restarted: restart, as an orchestrator would.
      if ((code == kExitRestart || code > 128) && restarts_[name] < max_restarts) {
        ++restarts_[name];
        std::fprintf(stderr, "onebit-launch: %s exited with code %d; restarting it (%d of %d)\n",
                     name.c_str(), code, restarts_[name], max_restarts);
        ONEBIT_RETURN_IF_ERROR(Respawn(i).status());
        continue;
      }
      const std::string last = LastLogLine(LogPath(name));
      absl::Status ended = absl::AbortedError(absl::StrCat(
          code == kExitJobFailed ? "the job FAILED: " : "", name, " exited with code ", code,
          code == kExitRestart || code > 128 ? " and has no restart left" : "",
          last.empty() ? "" : absl::StrCat(" (", last, ")"), "; its log is ", LogPath(name)));
      // 78: the job failed for a reason no restart fixes; the error says so (IsPermanent).
      return code == kExitJobFailed ? MarkPermanent(std::move(ended)) : ended;
    }
    workers_done_ = static_cast<int>(done);
    if (done == workers_.size()) return absl::OkStatus();
    if (interrupted && *interrupted) return absl::CancelledError("interrupted");
    if (absl::Now() > deadline) return absl::DeadlineExceededError("the job took too long");
    if (each_poll) each_poll();
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
