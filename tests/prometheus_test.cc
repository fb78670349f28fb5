// A real Prometheus server (Debian's `prometheus`) scrapes a running job and answers, over
// its HTTP API, a worker metric and a coordinator metric.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/prometheus_process.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

using launcher::NumberField;
using launcher::ParseJsonValue;
using launcher::StringField;

// The value of the first series `query` returns, once Prometheus has one.
absl::StatusOr<double> QueryUntilPresent(httplib::Client& prom, const std::string& query,
                                         absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < give_up) {
    auto r = prom.Get(("/api/v1/query?query=" + query).c_str());
    if (r && r->status == 200) {
      last = r->body;
      auto v = ParseJsonValue(r->body, query);
      if (v.ok()) {
        const auto& data = v->struct_value().fields().at("data").struct_value().fields();
        const auto& result = data.at("result").list_value();
        if (result.values_size() > 0) {
          // "value": [timestamp, "number"]
          const auto& value = result.values(0).struct_value().fields().at("value").list_value();
          return std::stod(value.values(1).string_value());
        }
      }
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  return absl::DeadlineExceededError(absl::StrCat("no series for ", query, "; last answer: ", last));
}

TEST(PrometheusTest, ScrapesAWorkerAndTheCoordinator) {
  const std::string prometheus_bin = "/usr/bin/prometheus";
  ASSERT_EQ(access(prometheus_bin.c_str(), X_OK), 0)
      << "Prometheus is missing: apt-get install prometheus (deploy/install-deps.sh does)";
  const std::string dir = testing_paths::TestTmpDir() + "/prom";
  mkdir(dir.c_str(), 0755);

  JobConfig c;
  c.workers = 2;
  c.steps = 1000000;  // until stopped
  c.micro_batch = 8;
  c.log_every = 1000;
  c.workload.type = "synthetic";
  c.workload.parameters = 20000;
  c.optimizer.freeze_step = 50;
  const std::string config_path = dir + "/job.json";
  std::ofstream(config_path) << JobConfigToJson(c);
  launcher::LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = config_path;
  options.echo_all = false;
  launcher::LocalJob job(options, c);
  ASSERT_TRUE(job.Start().ok());

  // The workers' /metrics addresses, as they registered them.
  httplib::Client rest("http://" + job.rest_address());
  std::string worker_metrics;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (worker_metrics.empty() && absl::Now() < give_up) {
    auto r = rest.Get("/v1/members");
    if (r && r->status == 200) {
      auto v = ParseJsonValue(r->body, "/v1/members");
      ASSERT_TRUE(v.ok());
      const auto& members = v->struct_value().fields();
      if (members.count("members")) {
        for (const auto& m : members.at("members").list_value().values()) {
          if (StringField(m, "role") == "ROLE_WORKER") worker_metrics = StringField(m, "metricsAddress");
        }
      }
    }
    if (worker_metrics.empty()) absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_FALSE(worker_metrics.empty()) << "no worker registered a metrics address";

  const std::string yml = dir + "/prometheus.yml";
  std::ofstream(yml) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                     << "scrape_configs:\n"
                     << "  - job_name: onebit\n    static_configs:\n"
                     << "      - targets: ['" << worker_metrics << "', '" << job.metrics_address() << "']\n";
  absl::StatusOr<testing_paths::RunningPrometheus> prom_process =
      testing_paths::StartPrometheus(prometheus_bin, yml, dir);
  ASSERT_TRUE(prom_process.ok()) << prom_process.status();
  const std::string listen = prom_process->address;

  httplib::Client prom("http://" + listen);
  const absl::StatusOr<double> worker_step =
      QueryUntilPresent(prom, "onebit_worker_step", absl::Seconds(60));
  ASSERT_TRUE(worker_step.ok()) << worker_step.status();
  EXPECT_GT(*worker_step, 0);
  const absl::StatusOr<double> coordinator_workers =
      QueryUntilPresent(prom, "onebit_coordinator_workers_alive", absl::Seconds(30));
  ASSERT_TRUE(coordinator_workers.ok()) << coordinator_workers.status();
  EXPECT_EQ(*coordinator_workers, 2);

  prom_process->process->Terminate();
  auto stop = rest.Post("/v1/stop", "{}", "application/json");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->status, 200) << stop->body;
  EXPECT_TRUE(job.WaitForWorkers(absl::Seconds(60)).ok());
  job.Stop();
}

}  // namespace
}  // namespace onebit
