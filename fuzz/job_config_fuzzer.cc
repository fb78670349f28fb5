// config/job_config.h ParseJobConfig on arbitrary text, and what every process does next
// with a config that parses: size the model (config/model_spec.h), lay out the shards
// (compression/layout.h) and build the coordinator's state. A config that parses must
// print (JobConfigToJson) as JSON that parses again to the same config.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "compression/layout.h"
#include "config/job_config.h"
#include "config/model_spec.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/stubs/logging.h"

namespace onebit {
namespace {

void Check(absl::string_view text) {
  absl::StatusOr<JobConfig> config = ParseJobConfig(text);
  fuzz::Say("ParseJobConfig", config.status());
  if (!config.ok()) {
    ONEBIT_FUZZ_CHECK(!config.status().message().empty());
    return;
  }
  const std::string json = JobConfigToJson(*config);
  absl::StatusOr<JobConfig> again = ParseJobConfig(json);
  if (!again.ok()) {
    std::fprintf(stderr, "fuzz: printed config does not parse: %s\n%s\n",
                 std::string(again.status().message()).c_str(), json.c_str());
  }
  ONEBIT_FUZZ_CHECK(again.ok());
  ONEBIT_FUZZ_CHECK(JobConfigToJson(*again) == json);

  absl::StatusOr<size_t> parameters = WorkloadParameterCount(config->workload);
  if (parameters.ok()) {
    ONEBIT_FUZZ_CHECK(*parameters >= 1);
    const int servers = ServerCount(*config);
    if (servers > 0) (void)PsLayout::Create(*parameters, servers);
    (void)PeerPaddedSize(*parameters, config->workers);
  }

  FakeClock clock;
  CoordinatorOptions options;
  options.config = *config;
  fuzz::Say("Coordinator::Create", Coordinator::Create(options, &clock, nullptr).status());
}

}  // namespace
}  // namespace onebit

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  onebit::fuzz::QuietLogs();
  // Protobuf logs an ERROR for every string with invalid UTF-8 it serializes; the answers
  // are checked instead.
  if (!onebit::fuzz::Verbose()) google::protobuf::SetLogHandler(nullptr);
  // Protobuf's JSON parser and the coordinator set up static state on first use.
  onebit::Check(R"({"steps": 10, "onebit": {"workers": 2}})");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);
  onebit::Check(absl::string_view(reinterpret_cast<const char*>(data), size));
  // The parsed JSON tree is a few times the text; the printed config, the coordinator and
  // the default config are a fixed few kilobytes.
  // Protobuf's JSON parser spends about 1 KiB per nesting level, up to its depth limit.
  onebit::fuzz::HeapBudget::End(size, 32, 256 << 10);
  return 0;
}
