#include "tests/prometheus_process.h"

#include <utility>

namespace onebit::testing_paths {

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
  absl::StatusOr<std::string> address =
      WaitForLogMatch(options.log_path, "msg=\"Listening on\" address=([0-9.]+:[0-9]+)",
                      timeout, process->get());
  if (!address.ok()) return address.status();
  return RunningPrometheus{*std::move(process), *std::move(address)};
}

}  // namespace onebit::testing_paths
