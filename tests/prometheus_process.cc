#include "tests/prometheus_process.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace onebit::testing_paths {
namespace {

std::string ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Tail(const std::string& text) {
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

}  // namespace

absl::StatusOr<RunningPrometheus> StartPrometheus(const std::string& binary,
                                                  const std::string& config_yml,
                                                  const std::string& dir, absl::Duration timeout) {
  ProcessOptions options;
  options.name = "prometheus";
  options.argv = {binary, "--config.file=" + config_yml, "--storage.tsdb.path=" + dir + "/data",
                  "--web.listen-address=127.0.0.1:0"};
  options.log_path = dir + "/prometheus.log";
  absl::StatusOr<std::unique_ptr<Process>> process = Process::Start(options);
  if (!process.ok()) return process.status();
  // Prometheus 2.42 logs: ... msg="Listening on" address=127.0.0.1:36479
  const std::regex listening("msg=\"Listening on\" address=([0-9.]+:[0-9]+)");
  const absl::Time give_up = absl::Now() + timeout;
  while (absl::Now() < give_up) {
    const bool exited = (*process)->Exited(nullptr);
    const std::string log = ReadLog(options.log_path);
    std::smatch m;
    if (std::regex_search(log, m, listening)) return RunningPrometheus{*std::move(process), m[1]};
    if (exited) {
      return absl::UnavailableError(absl::StrCat("prometheus exited before listening:\n", Tail(log)));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("prometheus did not say where it listens within ",
                                                  absl::FormatDuration(timeout), ":\n",
                                                  Tail(ReadLog(options.log_path))));
}

}  // namespace onebit::testing_paths
