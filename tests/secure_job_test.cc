// A whole ps-mode job as real processes (coordinator, 2 shards, 2 workers) with the
// control plane secured: mutual TLS on every gRPC port, HTTPS on the REST mirror, the
// admin and member tokens from files named in the job config. The operator steers it with
// the real onebitctl: without the token, with a wrong one or with the member token the
// admin calls are refused and change nothing; with the admin token it forces the switch
// to compression and then stops the job, which finishes cleanly at that step. Certificates are made by
// the real openssl command.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "security/test_certs.h"
#include "tests/job_runner.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const char kAdminToken[] = "admin-5c0ffee5c0ffee5c0ffee5c0ffee5c0f";
const char kMemberToken[] = "member-b0a710ad0b0a710ad0b0a710ad0b0a7";

struct Ran {
  int code = -1;
  std::string output;
};

TEST(SecureJobTest, PsJobWithMutualTlsAndTokensRunsAndObeysOnlyTheAdmin) {
  const std::string dir = testing_paths::TestTmpDir() + "/secure-job";
  fs::create_directories(dir);
  absl::StatusOr<security::TestCerts> certs = security::MakeTestCerts(dir + "/pki");
  ASSERT_TRUE(certs.ok()) << "cannot make the test certificates: " << certs.status();
  const std::string admin_file = dir + "/pki/admin.token", member_file = dir + "/pki/member.token";
  ASSERT_TRUE(security::WriteTokenFile(admin_file, kAdminToken).ok());
  ASSERT_TRUE(security::WriteTokenFile(member_file, kMemberToken).ok());

  // Runs until the operator stops it (the static switch lies past the end).
  JobConfig config = testing_jobs::SmallJob("ps", 2, 20000, 19000, "");
  config.security.tls.ca_cert = certs->ca;
  config.security.tls.cert = certs->node;
  config.security.tls.key = certs->node_key;
  config.security.admin_token_file = admin_file;
  config.security.member_token_file = member_file;
  ASSERT_TRUE(ParseJobConfig(JobConfigToJson(config)).ok());
  const std::string config_path = dir + "/job.json";
  std::ofstream(config_path) << JobConfigToJson(config);

  launcher::LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = config_path;
  options.echo_all = false;
  options.coordinator_flags = {"--linger=30s"};
  launcher::LocalJob job(options, config);
  ASSERT_TRUE(job.Start().ok());

  // onebitctl with the given extra flags; its exit code and output.
  auto onebitctl = [&](std::vector<std::string> args) {
    ProcessOptions p;
    p.argv = {testing_paths::Runfile("tools/onebitctl"), "--coordinator=" + job.grpc_address(),
              "--tls_ca=" + certs->ca};
    p.argv.insert(p.argv.end(), args.begin(), args.end());
    p.log_path = dir + "/onebitctl.out";
    p.env_unset = {"ONEBIT_ADMIN_TOKEN"};
    fs::remove(p.log_path);
    Ran ran;
    absl::StatusOr<std::unique_ptr<Process>> proc = Process::Start(p);
    EXPECT_TRUE(proc.ok()) << proc.status();
    if (!proc.ok()) return ran;
    ran.code = (*proc)->Wait(absl::Seconds(60)).value_or(-1);
    std::ifstream in(p.log_path);
    ran.output.assign(std::istreambuf_iterator<char>(in), {});
    return ran;
  };
  const std::vector<std::string> client_cert = {"--tls_cert=" + certs->client,
                                                "--tls_key=" + certs->client_key};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::vector<std::string> as_admin = with(client_cert, {"--token_file=" + admin_file});

  // The REST mirror over HTTPS, with a client certificate and the admin token.
  httplib::Client rest("https://" + job.rest_address(), certs->client, certs->client_key);
  rest.set_ca_cert_path(certs->ca);
  rest.enable_server_certificate_verification(true);
  const httplib::Headers admin_header = {{"Authorization", std::string("Bearer ") + kAdminToken}};
  auto job_step = [&]() -> int64_t {
    httplib::Result r = rest.Get("/v1/job", admin_header);
    if (!r || r->status != 200) return -1;
    auto at = r->body.find("\"step\":\"");
    int64_t step = 0;
    if (at == std::string::npos) return 0;  // proto3 JSON leaves out a step of 0
    const std::string digits = r->body.substr(at + 8, r->body.find('"', at + 8) - at - 8);
    return absl::SimpleAtoi(digits, &step) ? step : -1;
  };
  auto wait_for_step = [&](int64_t at_least) {
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    int64_t step = job_step();
    while (step < at_least && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
      step = job_step();
    }
    return step;
  };
  ASSERT_GE(wait_for_step(5), 5) << "the secured job does not run; logs in " << dir;

  // Refused: no client certificate (the handshake), no token, a wrong token, the member's.
  Ran no_cert = onebitctl({"--token_file=" + admin_file, "freeze", "--now"});
  EXPECT_EQ(no_cert.code, 1) << no_cert.output;
  EXPECT_THAT(no_cert.output, HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(no_cert.output, HasSubstr("TLS"));
  Ran no_token = onebitctl(with(client_cert, {"freeze", "--now"}));
  EXPECT_EQ(no_token.code, 1) << no_token.output;
  EXPECT_THAT(no_token.output, HasSubstr("UNAUTHENTICATED"));
  const std::string wrong_file = dir + "/pki/wrong.token";
  ASSERT_TRUE(security::WriteTokenFile(wrong_file, "not-the-admin-token-0123456789").ok());
  Ran wrong = onebitctl(with(client_cert, {"--token_file=" + wrong_file, "stop"}));
  EXPECT_EQ(wrong.code, 1) << wrong.output;
  EXPECT_THAT(wrong.output, HasSubstr("UNAUTHENTICATED"));
  Ran member = onebitctl(with(client_cert, {"--token_file=" + member_file, "stop"}));
  EXPECT_EQ(member.code, 1) << member.output;
  EXPECT_THAT(member.output, HasSubstr("PERMISSION_DENIED"));
  Ran member_reads = onebitctl(with(client_cert, {"--token_file=" + member_file, "status"}));
  EXPECT_EQ(member_reads.code, 0) << member_reads.output;
  EXPECT_THAT(member_reads.output, HasSubstr("running"));
  httplib::Result anonymous_stop = rest.Post("/v1/stop", "{}", "application/json");
  ASSERT_TRUE(anonymous_stop);
  EXPECT_EQ(anonymous_stop->status, 401);

  // Obeyed: the admin forces the switch, lets it compress a while, and stops the job.
  Ran freeze = onebitctl(with(as_admin, {"freeze", "--now"}));
  ASSERT_EQ(freeze.code, 0) << freeze.output;
  EXPECT_THAT(freeze.output, HasSubstr("switch to compression scheduled after step"));
  const size_t at = freeze.output.find("scheduled after step ");
  const int64_t freeze_step = std::atoll(freeze.output.c_str() + at + 21);
  ASSERT_GT(freeze_step, 0) << freeze.output;
  ASSERT_GE(wait_for_step(freeze_step + 10), freeze_step + 10);
  // A stop at a step beyond every lease granted so far (so that every worker learns it
  // from its next lease and reports the last step); a step already leased is refused with
  // FAILED_PRECONDITION: then further on.
  int64_t stop_at = -1;
  for (int attempt = 1; attempt <= 5 && stop_at < 0; ++attempt) {
    const int64_t target = job_step() + 200 * attempt;
    Ran stop = onebitctl(with(as_admin, {"stop", "--at", absl::StrCat(target)}));
    if (stop.code == 0) {
      EXPECT_THAT(stop.output, HasSubstr(absl::StrCat("the job stops after step ", target)));
      stop_at = target;
    } else {
      EXPECT_THAT(stop.output, HasSubstr("FAILED_PRECONDITION"))
          << "coordinator log:\n" << testing_jobs::ReadAll(dir + "/coordinator.log");
    }
  }
  ASSERT_GT(stop_at, 0) << "the admin could not stop the job; coordinator log:\n"
                        << testing_jobs::ReadAll(dir + "/coordinator.log");

  const absl::Status done = job.WaitForWorkers(absl::Seconds(240));
  ASSERT_TRUE(done.ok()) << done;
  absl::StatusOr<std::vector<google::protobuf::Value>> summaries = job.Summaries();
  ASSERT_TRUE(summaries.ok()) << summaries.status();
  ASSERT_EQ(summaries->size(), 2u);
  for (const google::protobuf::Value& s : *summaries) {
    // Every worker switched where the admin said, and compressed until the stop.
    EXPECT_EQ(launcher::NumberField(s, "first_compression_step"), freeze_step + 1);
    EXPECT_GE(launcher::NumberField(s, "compression_steps"), 10);
    EXPECT_EQ(launcher::NumberField(s, "warmup_steps") + launcher::NumberField(s, "compression_steps"),
              stop_at);
  }
  // The lingering coordinator reports success to the admin.
  Ran status = onebitctl(with(as_admin, {"status"}));
  EXPECT_EQ(status.code, 0) << status.output;
  EXPECT_THAT(status.output, HasSubstr("succeeded"));
  job.Stop();

  const std::string coordinator_log = testing_jobs::ReadAll(dir + "/coordinator.log");
  EXPECT_THAT(coordinator_log, HasSubstr("(mutual TLS)"));
  EXPECT_THAT(coordinator_log, HasSubstr("(HTTPS)"));
  EXPECT_THAT(coordinator_log, HasSubstr("admin calls need the admin token"));
  EXPECT_THAT(testing_jobs::ReadAll(dir + "/server-0.log"), HasSubstr("gRPC (mutual TLS) on"));
}

}  // namespace
}  // namespace onebit
