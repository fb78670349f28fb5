// The probes and the stop signal of every long-running binary, as an orchestrator sees
// them: real processes (onebit-coordinator, onebit-server, onebit-worker), real HTTP on
// each one's metrics port (/healthz, /readyz, /metrics), SIGTERM and the exit code.
//
// - A ps job (2 shards, 2 workers): every process is live and, once it does its job
//   (coordinator serving, shard registered, worker training), ready; SIGTERM ends each
//   with exit 0, its port closed, the coordinator's address file removed.
// - Before the job exists (no coordinator to register with): the shard and the worker are
//   live but not ready, saying why, and SIGTERM still ends them at once with exit 0
//   (a worker blocked in registration, a shard in its retries).
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "coordinator/address_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

using testing_paths::FreePort;

using ::testing::HasSubstr;
using testing_paths::Runfile;

std::string NewDir(const std::string& name) {
  const std::string dir = absl::StrCat(testing_paths::TestTmpDir(), "/", name);
  mkdir(dir.c_str(), 0777);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A port nothing listens on now (bound to 0, then closed).
struct Reply {
  int status = 0;  // 0: no answer (connection refused, timeout)
  std::string body;
};

Reply Get(const std::string& host_port, const std::string& path) {
  const size_t colon = host_port.rfind(':');
  httplib::Client client(host_port.substr(0, colon), std::stoi(host_port.substr(colon + 1)));
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  httplib::Result result = client.Get(path.c_str());
  if (!result) return {};
  return {result->status, result->body};
}

// Polls GET path until it answers `status` (true) or `timeout` passes (false).
bool WaitForStatus(const std::string& host_port, const std::string& path, int status,
                   absl::Duration timeout, Reply* last = nullptr) {
  const absl::Time give_up = absl::Now() + timeout;
  Reply reply;
  while (true) {
    reply = Get(host_port, path);
    if (reply.status == status || absl::Now() > give_up) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (last != nullptr) *last = reply;
  return reply.status == status;
}

std::unique_ptr<Process> Start(const std::string& name, const std::string& binary,
                               const std::vector<std::string>& args, const std::string& dir) {
  ProcessOptions options;
  options.name = name;
  options.argv = {Runfile(binary)};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.log_path = absl::StrCat(dir, "/", name, ".log");
  absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

// Starts a worker with --metrics_port=0 and returns its /metrics address, from the line the
// worker prints once it listens ("" and a failure if it exited or did not say within 30 s).
// A port picked here and handed over raced with every other process binding port 0.
std::string StartWorker(const std::string& name, std::vector<std::string> args,
                        const std::string& dir, std::unique_ptr<Process>* worker) {
  args.push_back("--metrics_port=0");
  *worker = Start(name, "worker/onebit-worker", args, dir);
  if (*worker == nullptr) return "";
  absl::StatusOr<std::string> address =
      WaitForLogMatch(absl::StrCat(dir, "/", name, ".log"),
                      "/metrics, /healthz, /readyz on ([0-9.]+:[0-9]+)", absl::Seconds(30),
                      worker->get());
  EXPECT_TRUE(address.ok()) << address.status();
  return address.ok() ? *address : "";
}

// SIGTERM, then the exit code within `timeout` (-1 if it did not exit).
int Stop(Process& process, absl::Duration timeout = absl::Seconds(15)) {
  process.Signal(SIGTERM);
  absl::StatusOr<int> code = process.Wait(timeout);
  if (!code.ok()) {
    process.Terminate(absl::Seconds(1));
    return -1;
  }
  return *code;
}

// A ps job that trains long enough to be stopped while it runs; slow failure detection,
// so that stopping the members one after the other is no failure the others react to.
JobConfig LongPsJob() {
  JobConfig c;
  c.workers = 2;
  c.steps = 1000000;
  c.micro_batch = 8;
  c.lease_steps = 4;
  c.log_every = 1000;
  c.workload.type = "synthetic";
  c.workload.parameters = 5003;
  c.optimizer.freeze_step = 10;
  c.exchange.mode = "ps";
  c.exchange.servers = 2;
  c.failure.heartbeat_timeout_s = 60;
  c.failure.coordinator_retry_s = 120;
  return c;
}

// `c` as dir/job.json; returns the path.
std::string WriteConfig(const std::string& dir, const JobConfig& c = LongPsJob()) {
  const std::string path = dir + "/job.json";
  std::ofstream(path) << JobConfigToJson(c);
  return path;
}

TEST(ProcessHealthTest, EveryProcessOfAJobIsLiveReadyAndStopsOnSigterm) {
  const std::string dir = NewDir("job");
  const std::string config = WriteConfig(dir);
  const std::string coord_file = dir + "/coordinator.json";
  std::unique_ptr<Process> coordinator =
      Start("coordinator", "coordinator/onebit-coordinator",
            {"--config=" + config, "--address_file=" + coord_file}, dir);
  ASSERT_NE(coordinator, nullptr);
  ASSERT_TRUE(WaitForFile(coord_file, absl::Seconds(30), coordinator.get()).ok())
      << ReadFile(dir + "/coordinator.log");
  absl::StatusOr<CoordinatorAddresses> coord = ReadAddressFile(coord_file);
  ASSERT_TRUE(coord.ok()) << coord.status();
  EXPECT_EQ(Get(coord->metrics, "/healthz").status, 200);
  Reply reply = Get(coord->metrics, "/readyz");
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_THAT(Get(coord->metrics, "/metrics").body, HasSubstr("onebit_coordinator_"));

  std::vector<std::unique_ptr<Process>> shards;
  std::vector<std::string> shard_metrics;
  for (int s = 0; s < 2; ++s) {
    const std::string file = absl::StrCat(dir, "/shard", s, ".json");
    shards.push_back(Start(absl::StrCat("shard", s), "server/onebit-server",
                           {"--config=" + config, "--coordinator=" + coord->grpc,
                            absl::StrCat("--shard=", s), "--address_file=" + file},
                           dir));
    ASSERT_NE(shards.back(), nullptr);
    absl::StatusOr<std::string> json = WaitForFile(file, absl::Seconds(30), shards.back().get());
    ASSERT_TRUE(json.ok()) << json.status();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(*json, m, std::regex("\"metrics\": \"([^\"]+)\""))) << *json;
    shard_metrics.push_back(m[1]);
  }
  for (const std::string& address : shard_metrics) {
    EXPECT_EQ(Get(address, "/healthz").status, 200);
    EXPECT_TRUE(WaitForStatus(address, "/readyz", 200, absl::Seconds(30), &reply)) << reply.body;
    EXPECT_THAT(Get(address, "/metrics").body, HasSubstr("onebit_server_"));
  }

  std::vector<std::unique_ptr<Process>> workers;
  std::vector<std::string> worker_metrics;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back();
    worker_metrics.push_back(StartWorker(absl::StrCat("worker", w),
                                         {"--config=" + config, "--coordinator=" + coord->grpc},
                                         dir, &workers.back()));
    ASSERT_NE(worker_metrics.back(), "");
  }
  for (int w = 0; w < 2; ++w) {
    const std::string& address = worker_metrics[w];
    EXPECT_TRUE(WaitForStatus(address, "/healthz", 200, absl::Seconds(30)))
        << ReadFile(absl::StrCat(dir, "/worker", w, ".log"));
    EXPECT_TRUE(WaitForStatus(address, "/readyz", 200, absl::Seconds(60), &reply))
        << reply.body << ReadFile(absl::StrCat(dir, "/worker", w, ".log"));
  }
  // Training: the step counter moves past the switch (freeze_step 10).
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  std::smatch step;
  const std::regex step_re("onebit_worker_step(\\{[^}]*\\})? ([0-9.e+]+)");
  double last_step = 0;
  while (absl::Now() < give_up) {
    const std::string body = Get(worker_metrics[0], "/metrics").body;
    if (std::regex_search(body, step, step_re)) last_step = std::stod(step[2]);
    if (last_step > 12) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_GT(last_step, 12) << "worker 0 did not train past the switch";

  // SIGTERM each member: exit 0, its port closed.
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(Stop(*workers[w]), 0) << ReadFile(absl::StrCat(dir, "/worker", w, ".log"));
    EXPECT_EQ(Get(worker_metrics[w], "/healthz").status, 0);
  }
  EXPECT_THAT(ReadFile(dir + "/worker0.log"), HasSubstr("SIGTERM; leaving the job (exit 0)"));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(Stop(*shards[s]), 0) << ReadFile(absl::StrCat(dir, "/shard", s, ".log"));
    EXPECT_EQ(Get(shard_metrics[s], "/healthz").status, 0);
  }
  EXPECT_EQ(Stop(*coordinator), 0) << ReadFile(dir + "/coordinator.log");
  EXPECT_EQ(Get(coord->metrics, "/healthz").status, 0);
  EXPECT_NE(access(coord_file.c_str(), F_OK), 0) << "the address file is removed at exit";
}

TEST(ProcessHealthTest, NotReadyWithoutACoordinatorAndStillStopsAtOnce) {
  const std::string dir = NewDir("alone");
  const std::string config = WriteConfig(dir);
  const std::string nobody = absl::StrCat("127.0.0.1:", FreePort());  // no coordinator there
  const std::string shard_file = dir + "/shard0.json";
  std::unique_ptr<Process> shard =
      Start("shard0", "server/onebit-server",
            {"--config=" + config, "--coordinator=" + nobody, "--shard=0",
             "--address_file=" + shard_file},
            dir);
  std::unique_ptr<Process> worker;
  const std::string worker_metrics =
      StartWorker("worker0", {"--config=" + config, "--coordinator=" + nobody}, dir, &worker);
  ASSERT_NE(shard, nullptr);
  ASSERT_NE(worker_metrics, "");
  ASSERT_NE(worker, nullptr);
  absl::StatusOr<std::string> json = WaitForFile(shard_file, absl::Seconds(30), shard.get());
  ASSERT_TRUE(json.ok()) << json.status();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*json, m, std::regex("\"metrics\": \"([^\"]+)\""))) << *json;
  const std::string shard_metrics = m[1];

  EXPECT_EQ(Get(shard_metrics, "/healthz").status, 200);
  Reply reply = Get(shard_metrics, "/readyz");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.body, "not ready: starting\n");
  ASSERT_TRUE(WaitForStatus(worker_metrics, "/healthz", 200, absl::Seconds(30)))
      << ReadFile(dir + "/worker0.log");
  reply = Get(worker_metrics, "/readyz");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.body, "not ready: registering with the coordinator\n");

  // Both are blocked retrying the coordinator (for up to 120 s): SIGTERM ends them now.
  const absl::Time start = absl::Now();
  EXPECT_EQ(Stop(*worker, absl::Seconds(10)), 0) << ReadFile(dir + "/worker0.log");
  EXPECT_EQ(Stop(*shard, absl::Seconds(10)), 0) << ReadFile(dir + "/shard0.log");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(ReadFile(dir + "/shard0.log"), HasSubstr("while starting; exiting"));
}

// The processes of a running ps job (2 shards, 2 workers) and the metrics addresses.
struct PsJob {
  std::unique_ptr<Process> coordinator;
  std::vector<std::unique_ptr<Process>> shards, workers;
  std::vector<std::string> worker_metrics;
};

// Starts `config`'s job in `dir` and waits until worker 0 trained past step `past`.
void StartPsJob(const std::string& dir, const std::string& config, int64_t past, PsJob* job) {
  const std::string coord_file = dir + "/coordinator.json";
  job->coordinator = Start("coordinator", "coordinator/onebit-coordinator",
                           {"--config=" + config, "--address_file=" + coord_file}, dir);
  ASSERT_NE(job->coordinator, nullptr);
  ASSERT_TRUE(WaitForFile(coord_file, absl::Seconds(30), job->coordinator.get()).ok())
      << ReadFile(dir + "/coordinator.log");
  absl::StatusOr<CoordinatorAddresses> coord = ReadAddressFile(coord_file);
  ASSERT_TRUE(coord.ok()) << coord.status();
  for (int s = 0; s < 2; ++s) {
    job->shards.push_back(Start(absl::StrCat("shard", s), "server/onebit-server",
                                {"--config=" + config, "--coordinator=" + coord->grpc,
                                 absl::StrCat("--shard=", s)},
                                dir));
    ASSERT_NE(job->shards.back(), nullptr);
  }
  for (int w = 0; w < 2; ++w) {
    job->workers.emplace_back();
    job->worker_metrics.push_back(
        StartWorker(absl::StrCat("worker", w),
                    {"--config=" + config, "--coordinator=" + coord->grpc}, dir,
                    &job->workers.back()));
    ASSERT_NE(job->worker_metrics.back(), "");
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(90);
  std::smatch step;
  const std::regex step_re("onebit_worker_step(\\{[^}]*\\})? ([0-9.e+]+)");
  double last_step = 0;
  while (absl::Now() < give_up && last_step <= past) {
    const std::string body = Get(job->worker_metrics[0], "/metrics").body;
    if (std::regex_search(body, step, step_re)) last_step = std::stod(step[2]);
    absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_GT(last_step, past) << ReadFile(dir + "/worker0.log");
}

// SIGTERM ends every process with exit 0 within 5 s, whatever stopped before it.
// Checkpoints every 2 steps, so that a shard always has a part to report: with the
// coordinator stopped first, that report met a coordinator that was gone and the shard
// waited in its retries (under podman kube play, whose stopped pod's address is silent,
// until the 20 s grace ran out and it was killed, exit 137).
// kCoordinatorFrozen: the coordinator stopped with SIGSTOP first, as a stopped pod's address
// that no longer answers: the shards' reports of the checkpoints after it hang in their
// calls; then the shards and the workers get SIGTERM.
enum class StopOrder {
  kCoordinatorFirst,
  kShardsFirst,
  kWorkersFirst,
  kAllAtOnce,
  kCoordinatorFrozen
};

class StopOrderTest : public ::testing::TestWithParam<StopOrder> {};

TEST_P(StopOrderTest, EveryProcessExitsZeroWithinFiveSeconds) {
  const StopOrder order = GetParam();
  const std::string dir = NewDir(absl::StrCat("stop", static_cast<int>(order)));
  JobConfig c = LongPsJob();
  c.workload.parameters = 200003;
  c.optimizer.freeze_step = 4;
  c.checkpoint.dir = dir + "/checkpoints";
  mkdir(c.checkpoint.dir.c_str(), 0777);
  c.checkpoint.every_steps = 2;
  const std::string config = WriteConfig(dir, c);
  PsJob job;
  StartPsJob(dir, config, /*past=*/8, &job);
  if (HasFatalFailure()) return;

  // One group after the other (the next group 1 s after the last one exited, so that what
  // it meets is a peer that is gone); all at once in one group.
  std::vector<std::vector<std::pair<std::string, Process*>>> groups;
  auto coordinator = std::vector<std::pair<std::string, Process*>>{
      {"coordinator", job.coordinator.get()}};
  std::vector<std::pair<std::string, Process*>> shards, workers, all;
  for (int i = 0; i < 2; ++i) {
    shards.push_back({absl::StrCat("shard", i), job.shards[i].get()});
    workers.push_back({absl::StrCat("worker", i), job.workers[i].get()});
  }
  switch (order) {
    case StopOrder::kCoordinatorFirst: groups = {coordinator, shards, workers}; break;
    case StopOrder::kShardsFirst: groups = {shards, coordinator, workers}; break;
    case StopOrder::kWorkersFirst: groups = {workers, shards, coordinator}; break;
    case StopOrder::kAllAtOnce:
      all = coordinator;
      all.insert(all.end(), shards.begin(), shards.end());
      all.insert(all.end(), workers.begin(), workers.end());
      groups = {all};
      break;
    case StopOrder::kCoordinatorFrozen:
      job.coordinator->Signal(SIGSTOP);
      absl::SleepFor(absl::Seconds(2));  // the workers' leases run on; checkpoints follow
      groups = {shards, workers};
      break;
  }
  for (const auto& group : groups) {
    const absl::Time sent = absl::Now();
    for (const auto& [name, process] : group) process->Signal(SIGTERM);
    for (const auto& [name, process] : group) {
      absl::StatusOr<int> code = process->Wait(absl::Seconds(5) - (absl::Now() - sent));
      EXPECT_TRUE(code.ok()) << name << " still ran 5 s after SIGTERM\n"
                             << ReadFile(absl::StrCat(dir, "/", name, ".log"));
      if (code.ok()) {
        EXPECT_EQ(*code, 0) << name << "\n" << ReadFile(absl::StrCat(dir, "/", name, ".log"));
      } else {
        process->Terminate(absl::Seconds(1));
      }
    }
    absl::SleepFor(absl::Seconds(1));
  }
  if (order == StopOrder::kCoordinatorFrozen) {
    job.coordinator->Signal(SIGCONT);
    EXPECT_EQ(Stop(*job.coordinator), 0) << ReadFile(dir + "/coordinator.log");
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, StopOrderTest,
                         ::testing::Values(StopOrder::kCoordinatorFirst, StopOrder::kShardsFirst,
                                           StopOrder::kWorkersFirst, StopOrder::kAllAtOnce,
                                           StopOrder::kCoordinatorFrozen),
                         [](const ::testing::TestParamInfo<StopOrder>& info) {
                           switch (info.param) {
                             case StopOrder::kCoordinatorFirst: return "CoordinatorFirst";
                             case StopOrder::kShardsFirst: return "ShardsFirst";
                             case StopOrder::kWorkersFirst: return "WorkersFirst";
                             case StopOrder::kAllAtOnce: return "AllAtOnce";
                             case StopOrder::kCoordinatorFrozen: return "CoordinatorFrozen";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace onebit
