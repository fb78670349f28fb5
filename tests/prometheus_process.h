// A real Prometheus server (Debian's `prometheus`) for the tests that scrape a running job.
#ifndef ONEBIT_TESTS_PROMETHEUS_PROCESS_H_
#define ONEBIT_TESTS_PROMETHEUS_PROCESS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace onebit::testing_paths {

struct RunningPrometheus {
  std::unique_ptr<Process> process;
  std::string address;  // host:port of its HTTP API
};

// Starts `binary` with `config_yml`, its data and log (prometheus.log) in `dir`, listening on
// a port the kernel picks (127.0.0.1:0), and returns once its log says which (a port picked
// here and handed over on the command line raced with every other bind meanwhile). An
// error with the log's end if it exits or does not say within `timeout`.
absl::StatusOr<RunningPrometheus> StartPrometheus(const std::string& binary,
                                                  const std::string& config_yml,
                                                  const std::string& dir,
                                                  absl::Duration timeout = absl::Seconds(60));

}  // namespace onebit::testing_paths

#endif  // ONEBIT_TESTS_PROMETHEUS_PROCESS_H_
