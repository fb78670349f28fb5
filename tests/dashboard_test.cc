// The Grafana dashboard (deploy/grafana/dashboards/onebit.json) against a real job: a
// coordinator, 2 parameter-server shards and 2 workers (Fashion-MNIST, automatic freezing,
// checkpoints) run as processes, past the switch to compression and past a checkpoint.
// Then
//   1. every metric name in every query of the dashboard is among the sample names the
//      processes' /metrics really serve (read directly from every process), and a query
//      naming a metric nobody exports is caught the same way;
//   2. a real Prometheus (Debian's) scrapes every process, and every query, as Grafana
//      sends it ($__rate_interval filled in), returns at least one finite value over the
//      job's run: every panel has data in a job like this one.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/promql_names.h"
#include "tests/prometheus_process.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

using launcher::NumberField;
using launcher::ParseJsonValue;
using launcher::StringField;

constexpr char kDashboard[] = "deploy/grafana/dashboards/onebit.json";
constexpr char kDatasource[] = "deploy/grafana/provisioning/datasources/prometheus.yaml";
// Grafana's $__rate_interval for a 1 s scrape interval is at least 4 scrapes; a little more
// keeps a loaded test machine's late scrapes inside the window.
constexpr char kRateInterval[] = "10s";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Query {
  std::string panel;
  std::string expr;
};

// Every target of every panel (rows included), in order.
std::vector<Query> DashboardQueries(const google::protobuf::Value& dashboard) {
  std::vector<Query> queries;
  const auto& fields = dashboard.struct_value().fields();
  if (!fields.count("panels")) return queries;
  std::vector<const google::protobuf::Value*> panels;
  for (const auto& p : fields.at("panels").list_value().values()) {
    panels.push_back(&p);
    const auto& pf = p.struct_value().fields();
    if (pf.count("panels")) {
      for (const auto& inner : pf.at("panels").list_value().values()) panels.push_back(&inner);
    }
  }
  for (const google::protobuf::Value* p : panels) {
    const auto& pf = p->struct_value().fields();
    if (!pf.count("targets")) continue;
    for (const auto& t : pf.at("targets").list_value().values()) {
      queries.push_back({StringField(*p, "title"), StringField(t, "expr")});
    }
  }
  return queries;
}

absl::StatusOr<google::protobuf::Value> GetJson(httplib::Client& client, const std::string& path) {
  auto r = client.Get(path.c_str());
  if (!r) return absl::UnavailableError(absl::StrCat(path, ": ", httplib::to_string(r.error())));
  if (r->status != 200) {
    return absl::UnavailableError(absl::StrCat(path, ": HTTP ", r->status, " ", r->body));
  }
  return ParseJsonValue(r->body, path);
}

// Finite values in a query_range answer, over all its series.
int FiniteValues(const google::protobuf::Value& answer) {
  const auto& data = answer.struct_value().fields().at("data").struct_value().fields();
  int finite = 0;
  for (const auto& series : data.at("result").list_value().values()) {
    for (const auto& point : series.struct_value().fields().at("values").list_value().values()) {
      const double v = std::strtod(point.list_value().values(1).string_value().c_str(), nullptr);
      if (std::isfinite(v)) ++finite;
    }
  }
  return finite;
}

TEST(DashboardTest, EveryQueryNamesExportedMetricsAndHasDataInARealJob) {
  const std::string prometheus_bin = "/usr/bin/prometheus";
  ASSERT_EQ(access(prometheus_bin.c_str(), X_OK), 0)
      << "Prometheus is missing: apt-get install prometheus (deploy/install-deps.sh does)";
  JobConfig c;
  if (access((c.workload.data_dir + "/t10k-labels-idx1-ubyte.gz").c_str(), R_OK) != 0) {
    GTEST_SKIP() << "Fashion-MNIST is not installed under " << c.workload.data_dir
                 << " (apt-get install dataset-fashion-mnist): the test-accuracy panel "
                    "needs a workload with a test set";
  }

  // The dashboard and its datasource: the queries to check, the uid they refer to.
  auto dashboard = ParseJsonValue(ReadFile(testing_paths::Runfile(kDashboard)), kDashboard);
  ASSERT_TRUE(dashboard.ok()) << dashboard.status();
  const std::vector<Query> queries = DashboardQueries(*dashboard);
  ASSERT_GE(queries.size(), 20u) << "the dashboard lost its panels";
  EXPECT_NE(ReadFile(testing_paths::Runfile(kDatasource)).find("uid: prometheus"),
            std::string::npos);
  EXPECT_NE(ReadFile(testing_paths::Runfile(kDashboard)).find("\"uid\": \"prometheus\""),
            std::string::npos);

  const std::string dir = testing_paths::TestTmpDir() + "/dashboard";
  mkdir(dir.c_str(), 0755);
  c.workers = 2;
  c.steps = 1000000;  // until stopped
  c.micro_batch = 16;
  c.lease_steps = 5;
  c.log_every = 10;  // the worker error norm is measured on progress-line steps
  c.workload.type = "fashion_mnist";
  c.workload.hidden = {32};
  c.workload.eval_every = 20;
  c.optimizer.lr = 1e-3;
  c.optimizer.eps = 1e-5;
  c.exchange.mode = "ps";
  c.exchange.servers = 2;
  c.freeze.mode = "automatic";
  c.freeze.report_interval = 10;
  c.freeze.min_warmup = 20;
  c.freeze.max_warmup = 40;  // the switch comes by step 41 whatever the variance does
  c.checkpoint.dir = dir + "/ckpt";
  c.checkpoint.every_steps = 25;
  c.checkpoint.resume = false;
  const std::string config_path = dir + "/job.json";
  std::ofstream(config_path) << JobConfigToJson(c);
  launcher::LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = config_path;
  options.echo_all = false;
  launcher::LocalJob job(options, c);
  const absl::Time job_start = absl::Now();
  ASSERT_TRUE(job.Start().ok());

  // Every process's /metrics: the coordinator's, and each member's as it registered it.
  httplib::Client rest("http://" + job.rest_address());
  rest.set_read_timeout(10, 0);
  std::vector<std::string> targets = {job.metrics_address()};
  for (absl::Time give_up = absl::Now() + absl::Seconds(60);
       targets.size() < 5 && absl::Now() < give_up; absl::SleepFor(absl::Milliseconds(200))) {
    auto members = GetJson(rest, "/v1/members");
    if (!members.ok() || !members->struct_value().fields().count("members")) continue;
    std::vector<std::string> found = {job.metrics_address()};
    for (const auto& m : members->struct_value().fields().at("members").list_value().values()) {
      if (!StringField(m, "metricsAddress").empty()) found.push_back(StringField(m, "metricsAddress"));
    }
    targets = found;
  }
  ASSERT_EQ(targets.size(), 5u) << "expected the coordinator, 2 shards and 2 workers: "
                                << absl::StrJoin(targets, ", ");

  const std::string yml = dir + "/prometheus.yml";
  std::ofstream(yml) << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                     << "scrape_configs:\n  - job_name: onebit\n    static_configs:\n"
                     << "      - targets: ['" << absl::StrJoin(targets, "', '") << "']\n";
  absl::StatusOr<testing_paths::RunningPrometheus> prom_process =
      testing_paths::StartPrometheus(prometheus_bin, yml, dir);
  ASSERT_TRUE(prom_process.ok()) << prom_process.status();
  const std::string listen = prom_process->address;

  // Past the switch, two evaluations and a checkpoint in compression (the first at 25 is
  // in warmup), and several scrapes of each.
  int64_t step = 0;
  for (absl::Time give_up = absl::Now() + absl::Seconds(300); absl::Now() < give_up;
       absl::SleepFor(absl::Milliseconds(500))) {
    auto status = GetJson(rest, "/v1/job");
    if (!status.ok()) continue;
    step = static_cast<int64_t>(NumberField(*status, "step"));
    if (step >= 110 && StringField(*status, "stage") == "STAGE_COMPRESSION" &&
        NumberField(*status, "lastCheckpointStep") >= 75) {
      break;
    }
  }
  ASSERT_GE(step, 110) << "the job did not get far enough; see " << dir;
  // Prometheus starts (and scrapes) in its own time: on a fast machine the job is past the
  // switch before the first scrape. Wait until every target has been scraped 8 times (the
  // job keeps training until this test stops it), so rates over 10 s have data.
  httplib::Client prom("http://" + listen);
  prom.set_read_timeout(30, 0);
  double scrapes = 0;
  for (absl::Time give_up = absl::Now() + absl::Seconds(120); absl::Now() < give_up;
       absl::SleepFor(absl::Milliseconds(500))) {
    auto r = prom.Post("/api/v1/query",
                       httplib::Params{{"query", "min(count_over_time(up[5m])) and count(up) == 5"}});
    if (!r || r->status != 200) continue;
    auto answer = ParseJsonValue(r->body, "up");
    if (!answer.ok()) continue;
    const auto& result =
        answer->struct_value().fields().at("data").struct_value().fields().at("result").list_value();
    if (result.values_size() == 1) {
      absl::SimpleAtod(result.values(0).struct_value().fields().at("value").list_value().values(1).string_value(),
                       &scrapes);
    }
    if (scrapes >= 8) break;
  }
  ASSERT_GE(scrapes, 8) << "Prometheus did not scrape the 5 targets 8 times; see " << dir;

  // 1. Names: the union of what every process serves now, in compression.
  std::set<std::string> exported;
  for (const std::string& target : targets) {
    httplib::Client client("http://" + target);
    client.set_read_timeout(10, 0);
    auto r = client.Get("/metrics");
    ASSERT_TRUE(r) << target << ": " << httplib::to_string(r.error());
    ASSERT_EQ(r->status, 200) << target;
    const std::set<std::string> names = promql::SampleNames(r->body);
    exported.insert(names.begin(), names.end());
  }
  std::vector<std::string> exprs;
  for (const Query& q : queries) {
    exprs.push_back(promql::SubstituteGrafanaVariables(q.expr, kRateInterval));
  }
  const std::vector<std::string> missing = promql::MissingMetrics(exprs, exported);
  EXPECT_TRUE(missing.empty()) << absl::StrJoin(missing, "\n");
  // The check catches a query that names what nobody exports (the same sets).
  std::vector<std::string> with_typo = exprs;
  with_typo.push_back("avg(onebit_worker_step_second_count)");
  EXPECT_EQ(promql::MissingMetrics(with_typo, exported).size(), missing.size() + 1);

  // 2. Data: every query over the run so far, through the real Prometheus.
  const std::string start = absl::StrCat(absl::ToUnixSeconds(job_start));
  const std::string end = absl::StrCat(absl::ToUnixSeconds(absl::Now()));
  for (size_t i = 0; i < queries.size(); ++i) {
    const httplib::Params params = {
        {"query", exprs[i]}, {"start", start}, {"end", end}, {"step", "1"}};
    auto r = prom.Post("/api/v1/query_range", params);
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << queries[i].panel << ": " << exprs[i] << "\n" << r->body;
    if (r->status != 200) continue;
    auto answer = ParseJsonValue(r->body, exprs[i]);
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_GT(FiniteValues(*answer), 0)
        << "panel \"" << queries[i].panel << "\": no data for " << exprs[i] << "\n"
        << r->body.substr(0, 500);
  }

  prom_process->process->Terminate();
  auto stop = rest.Post("/v1/stop", "{}", "application/json");
  ASSERT_TRUE(stop);
  EXPECT_EQ(stop->status, 200) << stop->body;
  EXPECT_TRUE(job.WaitForWorkers(absl::Seconds(60)).ok());
  job.Stop();
}

}  // namespace
}  // namespace onebit
