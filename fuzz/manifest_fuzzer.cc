// checkpoint/manifest.h on a MANIFEST.json holding arbitrary bytes, in
// <scratch>/root/step-000000010/, and what onebit-coordinator does with it at start: list
// the committed checkpoints, plan the resume (verifying parts), and build the coordinator
// from that plan.
//
// A manifest that reads must be one this directory can hold: version 1, step 10 (the
// directory's), every part a plain file name inside the directory.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "config/job_config.h"
#include "coordinator/clock.h"
#include "coordinator/coordinator.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/stubs/logging.h"

namespace onebit::checkpoint {
namespace {

constexpr int64_t kStep = 10;
constexpr uint64_t kParameters = 1000;

struct Paths {
  std::string root;
  std::string dir;
  std::string manifest;
};

const Paths& GetPaths() {
  static const Paths* paths = [] {
    auto* p = new Paths;
    p->root = fuzz::ScratchDir() + "/root";
    absl::StatusOr<std::string> dir = MakeStepDir(p->root, kStep);
    if (!dir.ok()) {
      std::fprintf(stderr, "fuzz: %s\n", std::string(dir.status().message()).c_str());
      std::abort();
    }
    p->dir = *dir;
    p->manifest = JoinPath(p->dir, kManifestFile);
    return p;
  }();
  return *paths;
}

bool PlainName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         name.find('\0') == std::string::npos;
}

void Check() {
  const Paths& paths = GetPaths();
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(paths.dir);
  fuzz::Say("ReadManifest", manifest.status());
  std::vector<std::string> skipped;
  const std::vector<v1::CheckpointManifest> committed = ListCommitted(paths.root, &skipped);
  if (manifest.ok()) {
    ONEBIT_FUZZ_CHECK(manifest->version() == kManifestVersion);
    ONEBIT_FUZZ_CHECK(manifest->step() == kStep);
    for (const v1::CheckpointPart& part : manifest->parts()) {
      ONEBIT_FUZZ_CHECK(PlainName(part.file()));
    }
    ONEBIT_FUZZ_CHECK(committed.size() == 1 && skipped.empty());
    (void)VerifyCheckpoint(paths.root, *manifest);
  } else {
    ONEBIT_FUZZ_CHECK(!manifest.status().message().empty());
    ONEBIT_FUZZ_CHECK(committed.empty() && skipped.size() == 1);
  }

  JobConfig config;
  config.workers = 2;
  config.steps = 100;
  config.optimizer.freeze_step = 50;
  config.checkpoint.dir = paths.root;
  config.checkpoint.every_steps = 10;
  absl::StatusOr<ResumePlan> plan = PlanResume(config, kParameters);
  fuzz::Say("PlanResume", plan.status());
  if (!plan.ok()) return;
  FakeClock clock;
  CoordinatorOptions options;
  options.config = config;
  options.num_parameters = kParameters;
  options.resume = plan->resume;
  options.resume_freeze_step = plan->freeze_step;
  options.committed = plan->committed;
  options.commit_checkpoint = [](const v1::CheckpointManifest&) { return absl::OkStatus(); };
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(options, &clock, nullptr);
  fuzz::Say("Coordinator::Create", coordinator.status());
  if (coordinator.ok()) {
    (void)(*coordinator)->GetJob(v1::GetJobRequest());
    (void)(*coordinator)->ListCheckpoints(v1::ListCheckpointsRequest());
  }
}

}  // namespace
}  // namespace onebit::checkpoint

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  onebit::fuzz::HeapBudget::Install();
  onebit::fuzz::QuietLogs();
  // Protobuf logs an ERROR for every string with invalid UTF-8 it serializes; the answers
  // are checked instead.
  if (!onebit::fuzz::Verbose()) google::protobuf::SetLogHandler(nullptr);
  const auto& paths = onebit::checkpoint::GetPaths();
  onebit::fuzz::WriteFileOrDie(paths.manifest, R"({"version": 1, "step": "10"})");
  onebit::checkpoint::Check();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onebit::fuzz::WriteFileOrDie(onebit::checkpoint::GetPaths().manifest,
                               absl::string_view(reinterpret_cast<const char*>(data), size));
  onebit::fuzz::HeapBudget::Begin();
  onebit::fuzz::Canary(data, size);
  onebit::checkpoint::Check();
  // The text read twice (ReadManifest, ListCommitted) and parsed, and a coordinator;
  // protobuf's JSON parser spends about 1 KiB per nesting level, up to its depth limit.
  onebit::fuzz::HeapBudget::End(size, 32, 256 << 10);
  return 0;
}
