// The real binaries as child processes: onebit-coordinator started from a config file,
// found through its address file, driven with onebitctl and over REST while workers (gRPC
// clients in this process) run a short job; it exits by itself once the job is over, on
// SIGTERM, and with a message naming the key when the config is bad.
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "coordinator/address_file.h"
#include "coordinator/coordinator_client.h"
#include "proto/proto_json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_paths.h"
#include "httplib.h"

namespace onebit {
namespace {

using ::testing::HasSubstr;

using testing_paths::Env;

using testing_paths::Runfile;

std::string NewDir(const std::string& name) {
  static int counter = 0;
  std::string dir = absl::StrCat(Env("TEST_TMPDIR", "/tmp"), "/", name, "_", counter++);
  mkdir(dir.c_str(), 0777);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// A child process with stdout and stderr in files of their own.
struct Child {
  std::unique_ptr<Process> process;  // null if it could not start
  std::string out_path, err_path;
  std::string out() const { return ReadFile(out_path); }
  std::string err() const { return ReadFile(err_path); }
};

// `name` names the output files in `dir`; they are appended to, so use a new one per child.
Child Spawn(const std::string& binary, const std::vector<std::string>& args, const std::string& dir,
            const std::string& name) {
  Child child;
  child.out_path = absl::StrCat(dir, "/", name, ".out");
  child.err_path = absl::StrCat(dir, "/", name, ".err");
  ProcessOptions options;
  options.argv = {binary};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.log_path = child.out_path;
  options.stderr_path = child.err_path;
  absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (process.ok()) child.process = *std::move(process);
  return child;
}

// Whether the child has exited (reaping it if so).
bool Exited(Child& child) { return child.process == nullptr || child.process->Exited(nullptr); }

// The exit code, or -1 if the child did not exit within `timeout` (it is then killed).
int Wait(Child& child, absl::Duration timeout = absl::Seconds(30)) {
  if (child.process == nullptr) return -1;
  const absl::StatusOr<int> code = child.process->Wait(timeout);
  if (code.ok()) return *code;
  child.process->Signal(SIGKILL);
  (void)child.process->Wait(absl::Seconds(10));
  return -1;
}

struct Ran {
  int code;
  std::string out, err;
};

Ran Onebitctl(const std::string& dir, const std::vector<std::string>& args) {
  static int n = 0;
  Child child = Spawn(Runfile("tools/onebitctl"), args, dir, absl::StrCat("onebitctl_", n++));
  const int code = Wait(child);
  return Ran{code, child.out(), child.err()};
}

std::string JobConfigJson(int workers, int64_t steps, int64_t freeze_step) {
  return absl::StrCat(
      R"({"steps": )", steps, R"(, "optimizer": {"type": "OneBitAdam", "params": {"freeze_step": )",
      freeze_step, R"(}}, "onebit": {"workers": )", workers, R"(, "lease_steps": 5}})");
}

// A started onebit-coordinator and where it listens.
struct Coordinator {
  Child child;
  CoordinatorAddresses addresses;
  std::string address_file;
};

Coordinator StartCoordinator(const std::string& dir, const std::string& config_json,
                             const std::vector<std::string>& extra_flags = {}) {
  Coordinator c;
  const std::string config = absl::StrCat(dir, "/job.json");
  WriteFile(config, config_json);
  c.address_file = absl::StrCat(dir, "/coordinator.json");
  std::vector<std::string> args = {absl::StrCat("--config=", config),
                                   absl::StrCat("--address_file=", c.address_file),
                                   "--heartbeat_timeout=2s", "--linger=300ms"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  c.child = Spawn(Runfile("coordinator/onebit-coordinator"), args, dir, "coordinator");
  for (int i = 0; i < 1000 && !Exited(c.child); ++i) {
    absl::StatusOr<CoordinatorAddresses> read = ReadAddressFile(c.address_file);
    if (read.ok()) {
      c.addresses = *read;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return c;
}

std::unique_ptr<httplib::Client> Http(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  auto client = std::make_unique<httplib::Client>(host_port.substr(0, colon),
                                                  std::stoi(host_port.substr(colon + 1)));
  client->set_read_timeout(10, 0);
  return client;
}

// One worker: registers, heartbeats, runs every leased step to the end, reports the last.
// With `hold`, the worker waits after registering until *hold is false, so a test can look
// at the members before the job can end (however slow the machine).
absl::Status RunWorker(const std::string& address, const std::string& id,
                       const std::atomic<bool>* hold = nullptr) {
  GrpcClientOptions options;
  options.address = address;
  absl::StatusOr<std::unique_ptr<CoordinatorClient>> client = NewGrpcCoordinatorClient(options);
  if (!client.ok()) return client.status();
  v1::RegisterRequest reg;
  reg.set_role(v1::ROLE_WORKER);
  reg.set_instance_id(id);
  reg.set_requested_rank(-1);
  absl::StatusOr<v1::RegisterResponse> registered = (*client)->Register(reg);
  if (!registered.ok()) return registered.status();
  SessionOptions session_options;
  session_options.rank = registered->rank();
  session_options.instance_id = id;
  session_options.heartbeat_interval = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<CoordinatorSession>> session =
      (*client)->StartSession(session_options, nullptr);
  if (!session.ok()) return session.status();
  while (hold != nullptr && hold->load()) absl::SleepFor(absl::Milliseconds(5));
  int64_t through = 0, freeze = -1, step = 1;
  for (;; ++step) {
    if (step > through) {
      v1::LeaseRequest lease;
      lease.set_rank(registered->rank());
      lease.set_next_step(step);
      absl::StatusOr<v1::LeaseResponse> granted = (*client)->Lease(lease);
      if (!granted.ok()) return granted.status();
      through = granted->through_step();
      freeze = granted->freeze_step();
      if (through < step) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
    (*session)->SetStep(step);
  }
  v1::StatsReport last;
  last.set_rank(registered->rank());
  last.set_step(step - 1);
  last.set_stage(freeze >= 0 && step - 1 > freeze ? v1::STAGE_COMPRESSION : v1::STAGE_WARMUP);
  last.set_variance_change(-1);
  absl::Status reported = (*client)->ReportStats(last).status();
  absl::Status ended = (*session)->Stop();
  return reported.ok() ? ended : reported;
}

TEST(CoordinatorProcessTest, AJobDrivenWithOnebitctlAndRest) {
  const std::string dir = NewDir("job");
  const std::string state = absl::StrCat("--state_file=", dir, "/state.json");
  Coordinator c = StartCoordinator(dir, JobConfigJson(2, 40, 10), {state});
  ASSERT_FALSE(c.addresses.grpc.empty()) << "no address file; stderr:\n" << c.child.err();
  const std::string flag = absl::StrCat("--coordinator=", c.addresses.grpc);
  GrpcClientOptions client_options;
  client_options.address = c.addresses.grpc;
  absl::StatusOr<v1::JobStatus> first = (*NewGrpcCoordinatorClient(client_options))->GetJob({});
  ASSERT_TRUE(first.ok()) << first.status();

  Ran status = Onebitctl(dir, {flag, "status"});
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("switch     after step 10 (static)"));
  EXPECT_THAT(status.out, HasSubstr("workers    0/2 registered, 0 alive"));
  EXPECT_THAT(status.out, HasSubstr("stop       after step 40"));

  // onebitctl --json and REST print the same status.
  auto rest = Http(c.addresses.rest);
  Ran json = Onebitctl(dir, {flag, "--json", "status"});
  ASSERT_EQ(json.code, 0) << json.err;
  auto job = rest->Get("/v1/job");
  ASSERT_TRUE(job);
  EXPECT_EQ(json.out, job->body);

  Ran freeze = Onebitctl(dir, {flag, "freeze", "--at", "12"});
  EXPECT_EQ(freeze.code, 0) << freeze.err;
  EXPECT_THAT(freeze.out, HasSubstr("switch to compression scheduled after step 12"));
  EXPECT_THAT(rest->Get("/v1/job")->body, HasSubstr("\"freezeStep\":\"12\""));

  Ran bad = Onebitctl(dir, {flag, "freeze", "--at=-3"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("onebitctl: freeze: INVALID_ARGUMENT: at_step must be >= 0"));
  Ran usage = Onebitctl(dir, {flag, "freeze"});
  EXPECT_EQ(usage.code, 2);
  EXPECT_THAT(usage.err, HasSubstr("exactly one of --at STEP or --now"));
  Ran unknown = Onebitctl(dir, {flag, "launch"});
  EXPECT_EQ(unknown.code, 2);
  Ran no_address = Onebitctl(dir, {"status"});
  EXPECT_EQ(no_address.code, 2);

  Ran members = Onebitctl(dir, {flag, "members"});
  EXPECT_EQ(members.code, 0) << members.err;
  EXPECT_THAT(members.out, HasSubstr("no members registered"));

  Child watch = Spawn(Runfile("tools/onebitctl"), {flag, "watch", "--interval=50ms"}, dir, "watch");
  std::vector<absl::Status> results(2);
  std::atomic<bool> hold{true};
  std::thread w0([&] { results[0] = RunWorker(c.addresses.grpc, "w0", &hold); });
  std::thread w1([&] { results[1] = RunWorker(c.addresses.grpc, "w1", &hold); });
  // Members while the job runs (the workers wait until they are listed).
  for (int i = 0; i < 3000; ++i) {
    auto m = rest->Get("/v1/members");
    if (m && m->body.find("\"w1\"") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  Ran listed = Onebitctl(dir, {flag, "members"});
  EXPECT_EQ(listed.code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("worker"));
  EXPECT_THAT(listed.out, HasSubstr("w0"));
  EXPECT_THAT(listed.out, HasSubstr("w1"));
  hold = false;
  w0.join();
  w1.join();
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];

  // The job is over: watch saw it end, and the coordinator exits by itself.
  EXPECT_EQ(Wait(watch), 0) << watch.err();
  EXPECT_THAT(watch.out(), HasSubstr("job over after step 40"));
  EXPECT_THAT(watch.out(), HasSubstr("switch after step 12 (static)"));
  EXPECT_EQ(Wait(c.child, absl::Seconds(20)), 0) << c.child.err();
  EXPECT_THAT(c.child.err(), HasSubstr("job over: every worker reported its last step"));
  struct stat st;
  EXPECT_NE(stat(c.address_file.c_str(), &st), 0) << "address file left behind";

  // The state file says the job is over: started again with it, the coordinator runs a new
  // job (a supervisor that restarts it after the end does not resume a finished one).
  Coordinator again = StartCoordinator(dir, JobConfigJson(2, 40, 10), {state});
  ASSERT_FALSE(again.addresses.grpc.empty()) << again.child.err();
  client_options.address = again.addresses.grpc;
  absl::StatusOr<v1::JobStatus> next = (*NewGrpcCoordinatorClient(client_options))->GetJob({});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->state(), v1::JOB_STATE_STARTING);
  EXPECT_NE(next->job_id(), first->job_id());
  again.child.process->Signal(SIGTERM);
  EXPECT_EQ(Wait(again.child, absl::Seconds(15)), 0) << again.child.err();
}

TEST(CoordinatorProcessTest, StopThenSigterm) {
  const std::string dir = NewDir("stop");
  Coordinator c = StartCoordinator(dir, JobConfigJson(1, 100, 50));
  ASSERT_FALSE(c.addresses.grpc.empty()) << c.child.err();
  const std::string flag = absl::StrCat("--coordinator=", c.addresses.grpc);
  Ran stop = Onebitctl(dir, {flag, "stop", "--at", "30"});
  EXPECT_EQ(stop.code, 0) << stop.err;
  EXPECT_THAT(stop.out, HasSubstr("the job stops after step 30"));
  Ran again = Onebitctl(dir, {flag, "stop", "--at", "60"});
  EXPECT_EQ(again.code, 1);
  EXPECT_THAT(again.err, HasSubstr("FAILED_PRECONDITION: the job already stops after step 30"));
  // The REST mirror answers the same.
  auto rest = Http(c.addresses.rest);
  auto refused = rest->Post("/v1/stop", R"({"afterStep": "60"})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 409);
  EXPECT_THAT(refused->body, HasSubstr("the job already stops after step 30"));
  auto metrics = Http(c.addresses.metrics)->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("onebit_coordinator_stop_after_step 30"));

  c.child.process->Signal(SIGTERM);
  EXPECT_EQ(Wait(c.child, absl::Seconds(15)), 0) << c.child.err();
  EXPECT_THAT(c.child.err(), HasSubstr("received SIGTERM"));
  Ran gone = Onebitctl(dir, {flag, "--timeout=2s", "status"});
  EXPECT_EQ(gone.code, 1);
  EXPECT_THAT(gone.err, HasSubstr("UNAVAILABLE"));
}

// A worker's report of a failure no restart fixes fails the job at once; the coordinator
// exits 78 (do not restart), and started again with the same config and state file (a
// supervisor that restarts whatever exits non-zero) it is the same failed job, exiting 78
// again, never a fresh one that would fail the same way. Another config is a new job.
TEST(CoordinatorProcessTest, AFailedJobExits78AndStaysFailedUntilItsConfigChanges) {
  const std::string dir = NewDir("failed");
  const std::string state = absl::StrCat("--state_file=", dir, "/state.json");
  Coordinator c = StartCoordinator(dir, JobConfigJson(2, 100, 50), {state, "--linger=2s"});
  ASSERT_FALSE(c.addresses.grpc.empty()) << c.child.err();
  GrpcClientOptions options;
  options.address = c.addresses.grpc;
  std::unique_ptr<CoordinatorClient> client = *NewGrpcCoordinatorClient(options);
  v1::RegisterRequest reg;
  reg.set_role(v1::ROLE_WORKER);
  reg.set_instance_id("w0");
  reg.set_requested_rank(0);
  ASSERT_TRUE(client->Register(reg).ok());
  v1::FailureReport report;
  report.set_role(v1::ROLE_WORKER);
  report.set_rank(0);
  report.set_instance_id("w0");
  report.set_step(7);
  report.set_reason("training diverged: the loss is nan at step 7");
  const absl::Time reported = absl::Now();
  absl::StatusOr<v1::JobStatus> job = client->ReportFailure(report);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  const std::string job_id = job->job_id();
  EXPECT_EQ(Wait(c.child), 78) << c.child.err();
  EXPECT_LT(absl::Now() - reported, absl::Seconds(10));  // the linger, not heartbeat timeouts
  EXPECT_THAT(c.child.err(), HasSubstr("job FAILED: worker 0 (w0) failed in step 7"));

  // Restarted as it was: the same failed job, which says why to whoever asks.
  Coordinator again = StartCoordinator(dir, JobConfigJson(2, 100, 50), {state, "--linger=3s"});
  ASSERT_FALSE(again.addresses.grpc.empty()) << again.child.err();
  Ran status = Onebitctl(dir, {absl::StrCat("--coordinator=", again.addresses.grpc), "status"});
  EXPECT_THAT(status.out, HasSubstr("FAILED"));
  EXPECT_THAT(status.out, HasSubstr("worker 0 (w0) failed in step 7"));
  EXPECT_THAT(status.out, HasSubstr(job_id));
  EXPECT_EQ(Wait(again.child), 78) << again.child.err();
  EXPECT_THAT(again.child.err(), HasSubstr("FAILED before this coordinator started"));

  // The fix (another config) is a new job.
  Coordinator fixed = StartCoordinator(dir, JobConfigJson(2, 120, 50), {state});
  ASSERT_FALSE(fixed.addresses.grpc.empty()) << fixed.child.err();
  options.address = fixed.addresses.grpc;
  client = *NewGrpcCoordinatorClient(options);
  job = client->GetJob({});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_STARTING);
  EXPECT_NE(job->job_id(), job_id);
  fixed.child.process->Signal(SIGTERM);
  EXPECT_EQ(Wait(fixed.child, absl::Seconds(15)), 0) << fixed.child.err();
}

// failure.max_restarts bounds the recoveries whoever notices the failure: a coordinator
// restarted while it was recovering (a launcher restarting rank 0 after a peer died) goes
// on with that recovery, and one restarted in a running job is a recovery of its own, past
// the limit a failure.
TEST(CoordinatorProcessTest, ARestartedCoordinatorCountsEachFailureOnce) {
  const std::string dir = NewDir("restarts");
  const std::string state = absl::StrCat("--state_file=", dir, "/state.json");
  const std::string config = R"({"steps": 100, "onebit": {"workers": 2, "failure": {"max_restarts": 1}}})";
  int n = 0;
  auto start = [&](const std::string& heartbeat_timeout) {
    std::remove((dir + "/coordinator.json").c_str());  // the last one's address
    Coordinator c = StartCoordinator(dir, config, {state, heartbeat_timeout});
    EXPECT_FALSE(c.addresses.grpc.empty()) << c.child.err();
    return c;
  };
  auto client_of = [](const Coordinator& c) {
    GrpcClientOptions options;
    options.address = c.addresses.grpc;
    return *NewGrpcCoordinatorClient(options);
  };
  auto register_both = [&](CoordinatorClient& client) {
    for (int rank : {0, 1}) {
      v1::RegisterRequest reg;
      reg.set_role(v1::ROLE_WORKER);
      reg.set_instance_id(absl::StrCat("w", rank, "_", n++));
      reg.set_requested_rank(rank);
      ASSERT_TRUE(client.Register(reg).ok());
    }
  };
  auto await_state = [](CoordinatorClient& client, v1::JobState want) {
    absl::StatusOr<v1::JobStatus> job;
    for (int i = 0; i < 500; ++i) {
      job = client.GetJob({});
      if (job.ok() && job->state() == want) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return job;
  };
  auto kill = [](Coordinator& c) {
    c.child.process->Signal(SIGKILL);
    Wait(c.child);
  };

  // The workers register and go silent: the coordinator recovers (1 of at most 1) and dies.
  Coordinator first = start("--heartbeat_timeout=1s");
  ASSERT_FALSE(first.addresses.grpc.empty());
  std::unique_ptr<CoordinatorClient> client = client_of(first);
  register_both(*client);
  absl::StatusOr<v1::JobStatus> job = await_state(*client, v1::JOB_STATE_RECOVERING);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_RECOVERING) << first.child.err();
  EXPECT_EQ(job->recoveries(), 1);
  kill(first);

  // Restarted twice while recovering: the same recovery, not a second or a third.
  for (int restart = 0; restart < 2; ++restart) {
    Coordinator again = start("--heartbeat_timeout=30s");
    ASSERT_FALSE(again.addresses.grpc.empty());
    client = client_of(again);
    job = client->GetJob({});
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->state(), v1::JOB_STATE_RECOVERING) << again.child.err();
    EXPECT_EQ(job->recoveries(), 1);
    EXPECT_THAT(job->failure_reason(),
                HasSubstr(absl::StrCat("the coordinator restarted during recovery 1; generation ",
                                       2 + restart, " ended with it")));
    ASSERT_GE(job->recovery_log_size(), 1);
    EXPECT_THAT(job->recovery_log(0).reason(), HasSubstr("worker 0 (w0_0) sent no heartbeat for 1s"));
    EXPECT_THAT(again.child.err(),
                HasSubstr("(recovery 1 of at most 1, which the last coordinator began)"));
    if (restart == 1) {
      // The members come back: the recovery is over, and the state file says so.
      register_both(*client);
      job = await_state(*client, v1::JOB_STATE_RUNNING);
      ASSERT_TRUE(job.ok()) << job.status();
      EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
      const std::string recovered = R"("recovering": false)";
      for (int i = 0; i < 250 && ReadFile(dir + "/state.json").find(recovered) == std::string::npos; ++i) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      EXPECT_THAT(ReadFile(dir + "/state.json"), HasSubstr(recovered));
    }
    kill(again);
  }

  // A restart of the running job is a second recovery, one past the limit: the job fails.
  Coordinator last = start("--heartbeat_timeout=30s");
  EXPECT_EQ(Wait(last.child), 78) << last.child.err();
  EXPECT_THAT(last.child.err(), HasSubstr("job FAILED: the coordinator restarted; generation 4 "
                                          "ended with it; no recovery left "
                                          "(onebit.failure.max_restarts = 1)"));
}

TEST(CoordinatorProcessTest, BadConfigsExitWithTheKey) {
  const std::string dir = NewDir("bad");
  struct Case {
    std::string json;
    std::string expected;
  };
  const Case cases[] = {
      {R"({"onebit": {"workers": 0}})", "onebit.workers"},
      {R"({"onebit": {"lease_stepz": 3}})", "onebit.lease_stepz"},
      {R"({"onebit": {"freeze": {"mode": "sometimes"}}})", "onebit.freeze.mode"},
      {R"({"steps": )", "not valid JSON"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string config = absl::StrCat(dir, "/bad.json");
    WriteFile(config, c.json);
    Child child = Spawn(Runfile("coordinator/onebit-coordinator"),
                        {absl::StrCat("--config=", config)}, dir, absl::StrCat("bad_", n++));
    EXPECT_EQ(Wait(child), 1) << c.json;
    EXPECT_THAT(child.err(), HasSubstr(c.expected)) << c.json;
  }
  Child missing = Spawn(Runfile("coordinator/onebit-coordinator"),
                        {absl::StrCat("--config=", dir, "/missing.json")}, dir, "missing");
  EXPECT_EQ(Wait(missing), 1);
  EXPECT_THAT(missing.err(), HasSubstr("missing.json"));
  Child no_config = Spawn(Runfile("coordinator/onebit-coordinator"), {}, dir, "none");
  EXPECT_EQ(Wait(no_config), 2);
  EXPECT_THAT(no_config.err(), HasSubstr("--config"));
}

// A new job's checkpoint.dir need not exist: the coordinator makes it (its state file is
// the first thing written there), or says why it cannot.
TEST(CoordinatorProcessTest, ANewJobMakesItsCheckpointDirectory) {
  const std::string dir = NewDir("ckptdir");
  auto config = [](const std::string& ckpt) {
    return absl::StrCat(R"({"steps": 40, "onebit": {"workers": 2, "checkpoint": {"dir": ")", ckpt,
                        R"(", "every_steps": 10}}})");
  };
  Coordinator c = StartCoordinator(dir, config(dir + "/new/ckpt"));
  ASSERT_FALSE(c.addresses.grpc.empty()) << c.child.err();
  EXPECT_THAT(ReadFile(dir + "/new/ckpt/coordinator-state.json"), HasSubstr("jobId"));
  c.child.process->Signal(SIGTERM);
  EXPECT_EQ(Wait(c.child, absl::Seconds(15)), 0) << c.child.err();

  WriteFile(dir + "/a_file", "not a directory");
  Coordinator under_a_file = StartCoordinator(dir, config(dir + "/a_file/ckpt"));
  EXPECT_EQ(Wait(under_a_file.child), 1);
  EXPECT_THAT(under_a_file.child.err(),
              HasSubstr(absl::StrCat("cannot create onebit.checkpoint.dir ", dir, "/a_file/ckpt")));
}

TEST(CoordinatorProcessTest, APortInUseIsAClearError) {
  const std::string dir = NewDir("ports");
  Coordinator first = StartCoordinator(dir, JobConfigJson(1, 10, 5));
  ASSERT_FALSE(first.addresses.grpc.empty()) << first.child.err();
  const std::string port = first.addresses.grpc.substr(first.addresses.grpc.rfind(':') + 1);
  const std::string dir2 = NewDir("ports");
  Coordinator second = StartCoordinator(dir2, JobConfigJson(1, 10, 5), {"--port=" + port});
  EXPECT_EQ(Wait(second.child), 1);
  EXPECT_THAT(second.child.err(), HasSubstr("cannot bind 127.0.0.1:" + port));
  first.child.process->Signal(SIGTERM);
  EXPECT_EQ(Wait(first.child), 0);
}

}  // namespace
}  // namespace onebit
