// coordinator/rest_mirror.h HandleRest with arbitrary method, path and body, against a
// real Coordinator (FakeClock, real metrics): what the REST port does with every request.
// Each input is a fresh coordinator and a script of requests, so that admin calls meet
// every state (workers registered, leases granted, frozen, stopping, checkpoints pending).
//
// Input: requests separated by a line "%%". A request's first line is "METHOD PATH"; the
// rest is the body. Besides HTTP methods the script knows:
//   CONFIG static|automatic|adam|ps   (first request only) the job's freeze mode / exchange
//   RPC <Name>  + JSON body           a worker's or server's call to the same handler
//                                     (Register, Heartbeat, Lease, ReportStats,
//                                     ReportFailure, KvSet, KvGet, CommitPart), the
//                                     body in protobuf's JSON
//   CLOCK <seconds>                   advance the fake clock, then Tick()
//
// Every answer must be well-formed: a known HTTP status, a body that is JSON, an Allow
// header on a 405, and GET /v1/job always answers 200.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/metrics.h"
#include "coordinator/rest_mirror.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/struct.pb.h"
#include "proto/proto_json.h"

namespace onebit {
namespace {

constexpr int kMaxRequests = 64;

CoordinatorMetrics* Metrics() {
  static CoordinatorMetrics* metrics = new CoordinatorMetrics();
  return metrics;
}

JobConfig ConfigFor(absl::string_view name) {
  JobConfig config;
  config.workers = 2;
  config.steps = 100;
  config.lease_steps = 10;
  config.optimizer.freeze_step = 50;
  config.checkpoint.dir = "/unused";  // commits go to the function below, never to disk
  config.checkpoint.every_steps = 20;
  if (name == "automatic") {
    config.freeze.mode = "automatic";
    config.freeze.min_warmup = 5;
    config.freeze.max_warmup = 80;
    config.freeze.report_interval = 5;
  } else if (name == "adam") {
    config.optimizer.kind = OptimizerKind::kAdam;
  } else if (name == "ps") {
    config.exchange.mode = "ps";
    config.exchange.servers = 2;
  }
  return config;
}

void CheckResponse(const RestResponse& r) {
  if (fuzz::Verbose()) std::fprintf(stderr, "fuzz:   -> %d %s\n", r.http_status, r.body.c_str());
  static const std::set<int> known = {200, 400, 401, 403, 404, 405, 409,
                                      413, 429, 499, 500, 501, 503, 504};
  ONEBIT_FUZZ_CHECK(known.count(r.http_status) == 1);
  google::protobuf::Struct body;
  ONEBIT_FUZZ_CHECK(FromJson(r.body, &body).ok());
  ONEBIT_FUZZ_CHECK((r.http_status == 405) == !r.allow.empty());
  if (r.http_status != 200) {
    ONEBIT_FUZZ_CHECK(body.fields().count("code") == 1 && body.fields().count("message") == 1);
  }
}

// A handler call from a script line "RPC <Name>"; the answer does not matter, only that
// the call returns.
absl::Status StatusOf(const absl::Status& s) { return s; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

template <typename Request, typename Call>
void CallRpc(absl::string_view json, Call call) {
  Request request;
  const absl::Status parsed = FromJson(json.empty() ? absl::string_view("{}") : json, &request);
  if (!parsed.ok()) {
    fuzz::Say("  parse", parsed);
    return;
  }
  fuzz::Say("  ->", StatusOf(call(request)));
}

void RunRpc(Coordinator& c, absl::string_view name, absl::string_view body) {
  if (name == "Register") {
    CallRpc<v1::RegisterRequest>(body, [&](const auto& r) { return c.Register(r); });
  } else if (name == "Heartbeat") {
    CallRpc<v1::Heartbeat>(body, [&](const auto& r) { return c.Heartbeat(r); });
  } else if (name == "Lease") {
    CallRpc<v1::LeaseRequest>(body, [&](const auto& r) { return c.Lease(r); });
  } else if (name == "ReportStats") {
    CallRpc<v1::StatsReport>(body, [&](const auto& r) { return c.ReportStats(r); });
  } else if (name == "ReportFailure") {
    CallRpc<v1::FailureReport>(body, [&](const auto& r) { return c.ReportFailure(r); });
  } else if (name == "KvSet") {
    CallRpc<v1::KvSetRequest>(body, [&](const auto& r) { return c.KvSet(r); });
  } else if (name == "KvGet") {
    CallRpc<v1::KvGetRequest>(body, [&](v1::KvGetRequest r) {
      r.set_wait(false);  // a waiting get would only sleep
      return c.KvGet(r);
    });
  } else if (name == "CommitPart") {
    CallRpc<v1::CommitPartRequest>(body, [&](const auto& r) { return c.CommitPart(r); });
  }
}

void Run(absl::string_view script) {
  std::vector<absl::string_view> requests = absl::StrSplit(script, "\n%%\n");
  if (requests.size() > kMaxRequests) requests.resize(kMaxRequests);

  absl::string_view config_name = "static";
  if (!requests.empty() && absl::ConsumePrefix(&requests.front(), "CONFIG ")) {
    config_name = requests.front().substr(0, requests.front().find('\n'));
    requests.erase(requests.begin());
  }
  FakeClock clock;
  CoordinatorOptions options;
  options.config = ConfigFor(config_name);
  options.job_id = "fuzz-job";
  options.num_parameters = 1000;
  int commits = 0;
  options.commit_checkpoint = [&commits](const v1::CheckpointManifest&) {
    ++commits;
    return absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<Coordinator>> created =
      Coordinator::Create(options, &clock, Metrics());
  ONEBIT_FUZZ_CHECK(created.ok());
  Coordinator& coordinator = **created;

  for (absl::string_view request : requests) {
    const size_t eol = request.find('\n');
    const absl::string_view line = request.substr(0, eol);
    const absl::string_view body =
        eol == absl::string_view::npos ? absl::string_view() : request.substr(eol + 1);
    const size_t space = line.find(' ');
    const absl::string_view method = line.substr(0, space);
    const absl::string_view path =
        space == absl::string_view::npos ? absl::string_view() : line.substr(space + 1);
    if (fuzz::Verbose()) {
      std::fprintf(stderr, "fuzz: %s\n", std::string(line).c_str());
    }
    if (method == "RPC") {
      RunRpc(coordinator, path, body);
    } else if (method == "CLOCK") {
      int seconds = 0;
      if (absl::SimpleAtoi(path, &seconds) && seconds >= 0 && seconds <= 3600) {
        clock.Advance(absl::Seconds(seconds));
      }
      coordinator.Tick();
    } else {
      CheckResponse(HandleRest(&coordinator, Metrics(), method, path, body));
    }
  }
  const RestResponse job = HandleRest(&coordinator, Metrics(), "GET", "/v1/job", "");
  CheckResponse(job);
  ONEBIT_FUZZ_CHECK(job.http_status == 200);
  (void)coordinator.Finished();
  coordinator.Shutdown();
}

}  // namespace
}  // namespace onebit

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  onebit::fuzz::QuietLogs();
  // Protobuf logs an ERROR for every string with invalid UTF-8 it serializes; the answers
  // are checked instead.
  if (!onebit::fuzz::Verbose()) google::protobuf::SetLogHandler(nullptr);
  // Static route tables, descriptor pools and metric families are built on first use.
  onebit::Run("POST /v1/freeze\n{\"atStep\": \"10\"}\n%%\nGET /v1/members\n%%\nPOST /v1/x\n");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);
  onebit::Run(absl::string_view(reinterpret_cast<const char*>(data), size));
  // Parsed bodies and answers grow with the input; a coordinator is a fixed few kilobytes.
  onebit::fuzz::HeapBudget::End(size, 32, 256 << 10);
  return 0;
}
