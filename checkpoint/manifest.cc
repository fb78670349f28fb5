#include "checkpoint/manifest.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/part.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "config/optimizer_kind.h"
#include "proto/proto_json.h"

namespace onebit::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr char kStepPrefix[] = "step-";
// A manifest is a few hundred bytes per part; anything this large is not one.
constexpr uintmax_t kMaxManifestBytes = 16u << 20;

// The step a directory name stands for, or -1.
int64_t StepOfDirName(const std::string& name) {
  if (!absl::StartsWith(name, kStepPrefix)) return -1;
  int64_t step;
  if (!absl::SimpleAtoi(name.substr(sizeof(kStepPrefix) - 1), &step) || step < 0) return -1;
  return StepDirName(step) == name ? step : -1;
}

// A part file name must be a plain name inside the checkpoint's directory.
bool IsPlainName(const std::string& name) {
  return !name.empty() && name.size() < 256 && name.find('/') == std::string::npos &&
         name != "." && name != ".." && name.find('\0') == std::string::npos;
}

}  // namespace

std::string StepDirName(int64_t step) { return absl::StrFormat("%s%09d", kStepPrefix, step); }

std::string PartFileName(v1::Role role, int rank) {
  return absl::StrFormat("%s-%05d.part", role == v1::ROLE_SERVER ? "server" : "worker", rank);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : absl::StrCat(a, "/", b);
}

absl::StatusOr<std::string> MakeStepDir(const std::string& root, int64_t step) {
  const std::string dir = JoinPath(root, StepDirName(step));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  return dir;
}

absl::Status WriteManifest(const std::string& dir, const v1::CheckpointManifest& manifest) {
  return WriteFileAtomically(JoinPath(dir, kManifestFile), ToJson(manifest, /*pretty=*/true));
}

absl::StatusOr<v1::CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = JoinPath(dir, kManifestFile);
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("no manifest at ", path));
  if (size > kMaxManifestBytes) {
    return absl::DataLossError(absl::StrCat(path, ": ", size, " bytes is too large for a manifest"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path));
  v1::CheckpointManifest manifest;
  const absl::Status parsed = FromJson(text.str(), &manifest);
  if (!parsed.ok()) return absl::DataLossError(absl::StrCat(path, ": ", parsed.message()));
  if (manifest.version() != kManifestVersion) {
    return absl::DataLossError(absl::StrCat(path, ": manifest version ", manifest.version(),
                                            " (this build reads ", kManifestVersion, ")"));
  }
  const std::string name = fs::path(dir).filename().string();
  if (StepOfDirName(name) != manifest.step()) {
    return absl::DataLossError(absl::StrCat(path, ": step ", manifest.step(),
                                            " does not match the directory ", name));
  }
  for (const v1::CheckpointPart& part : manifest.parts()) {
    if (!IsPlainName(part.file())) {
      return absl::DataLossError(absl::StrCat(path, ": part file '", part.file().substr(0, 64),
                                              "' is not a plain name"));
    }
  }
  return manifest;
}

std::vector<v1::CheckpointManifest> ListCommitted(const std::string& root,
                                                  std::vector<std::string>* skipped) {
  std::vector<v1::CheckpointManifest> out;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(ec) || StepOfDirName(name) < 0) continue;
    if (!fs::exists(entry.path() / kManifestFile, ec)) continue;  // not committed
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(entry.path().string());
    if (!manifest.ok()) {
      if (skipped != nullptr) skipped->push_back(std::string(manifest.status().message()));
      continue;
    }
    out.push_back(*std::move(manifest));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.step() < b.step(); });
  return out;
}

absl::Status VerifyCheckpoint(const std::string& root, const v1::CheckpointManifest& manifest) {
  const std::string dir = JoinPath(root, StepDirName(manifest.step()));
  for (const v1::CheckpointPart& part : manifest.parts()) {
    const std::string path = JoinPath(dir, part.file());
    absl::StatusOr<WrittenFile> actual = ChecksumFile(path);
    if (!actual.ok()) return absl::DataLossError(absl::StrCat("part ", path, " is missing"));
    if (actual->bytes != part.bytes()) {
      return absl::DataLossError(absl::StrCat("part ", path, " has ", actual->bytes,
                                              " bytes, the manifest says ", part.bytes()));
    }
    if (actual->crc32 != part.crc32()) {
      return absl::DataLossError(absl::StrCat("part ", path, " fails its checksum (crc32 ",
                                              actual->crc32, ", the manifest says ", part.crc32(), ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> RemoveUncommitted(const std::string& root, int64_t before_step) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    const int64_t step = StepOfDirName(name);
    if (step < 0 || step >= before_step || !entry.is_directory(ec)) continue;
    if (fs::exists(entry.path() / kManifestFile, ec)) continue;
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    if (!rm) removed.push_back(name);
  }
  return removed;
}

std::vector<std::string> ApplyRetention(const std::string& root, int keep) {
  std::vector<std::string> removed;
  std::vector<v1::CheckpointManifest> committed = ListCommitted(root);
  const int excess = static_cast<int>(committed.size()) - std::max(keep, 1);
  for (int i = 0; i < excess; ++i) {
    const std::string name = StepDirName(committed[i].step());
    const fs::path dir = fs::path(root) / name;
    std::error_code ec;
    // The manifest goes first: a crash half-way leaves an uncommitted directory, which the
    // next RemoveUncommitted cleans, never a committed checkpoint with parts missing.
    fs::remove(dir / kManifestFile, ec);
    fs::remove_all(dir, ec);
    if (!ec) removed.push_back(name);
  }
  return removed;
}

absl::Status CommitCheckpoint(const std::string& root, const v1::CheckpointManifest& manifest,
                              int keep) {
  ONEBIT_RETURN_IF_ERROR(WriteManifest(JoinPath(root, StepDirName(manifest.step())), manifest));
  ApplyRetention(root, keep);
  RemoveUncommitted(root, manifest.step());
  return absl::OkStatus();
}

std::string TopologyKey(const JobConfig& config) {
  const ExchangeConfig& x = config.exchange;
  // The error buffers of another compressor hold another quantisation's residuals: a
  // resume across compressors resets them (onebit, the default, adds nothing to the key,
  // so older checkpoints keep theirs).
  const std::string compressor =
      x.compressor == "onebit" ? "" : absl::StrCat(" compressor=", x.compressor);
  if (x.mode == "hierarchical") {
    return absl::StrCat("hierarchical local_size=", x.local_size, " inter=", x.inter,
                        x.inter == "ps" ? absl::StrCat(" servers=", x.servers) : "", compressor);
  }
  return absl::StrCat(x.mode == "ps" ? absl::StrCat("ps servers=", x.servers) : x.mode,
                      compressor);
}

absl::StatusOr<ResumePlan> PlanResume(const JobConfig& config, uint64_t num_parameters) {
  ResumePlan plan;
  const std::string& root = config.checkpoint.dir;
  if (root.empty()) return plan;
  std::vector<std::string> skipped;
  plan.committed = ListCommitted(root, &skipped);
  for (const std::string& why : skipped) plan.log.push_back(absl::StrCat("ignored: ", why));
  if (!config.checkpoint.resume) {
    if (!plan.committed.empty()) {
      plan.log.push_back(absl::StrCat("not resuming (onebit.checkpoint.resume is false); ",
                                      plan.committed.size(), " committed checkpoints in ", root));
    }
    return plan;
  }
  for (auto it = plan.committed.rbegin(); it != plan.committed.rend(); ++it) {
    const v1::CheckpointManifest& m = *it;
    const absl::Status verified = VerifyCheckpoint(root, m);
    if (!verified.ok()) {
      plan.log.push_back(absl::StrCat("checkpoint of step ", m.step(), " is damaged, falling back to ",
                                      "the previous one: ", verified.message()));
      continue;
    }
    // 0: the job learns its model's size from the workers (who check the checkpoint's).
    if (num_parameters != 0 && m.num_parameters() != num_parameters) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint of step ", m.step(), " in ", root, " has ", m.num_parameters(),
          " parameters, this job's model has ", num_parameters,
          ": use another onebit.checkpoint.dir, or set onebit.checkpoint.resume to false"));
    }
    const std::string optimizer = Traits(config.optimizer.kind).name;
    if (m.optimizer() != optimizer) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint of step ", m.step(), " in ", root, " was written by optimizer ",
          m.optimizer(), ", this job runs ", optimizer));
    }
    v1::ResumeFrom resume;
    resume.set_step(m.step());
    resume.set_name(StepDirName(m.step()));
    std::vector<std::string> differences;
    if (m.world_size() != config.workers) {
      differences.push_back(absl::StrCat("workers ", m.world_size(), " -> ", config.workers));
    }
    if (m.exchange_mode() != TopologyKey(config)) {
      differences.push_back(
          absl::StrCat("exchange '", m.exchange_mode(), "' -> '", TopologyKey(config), "'"));
    }
    const bool server_parts =
        std::any_of(m.parts().begin(), m.parts().end(),
                    [](const v1::CheckpointPart& p) { return p.role() == v1::ROLE_SERVER; });
    if (m.num_servers() > 0 && !server_parts) {
      // Only a warmup's checkpoint may lack them (the shards held nothing yet).
      if (m.freeze_step() >= 0 && m.step() > m.freeze_step()) {
        plan.log.push_back(absl::StrCat(
            "checkpoint of step ", m.step(), " is damaged, falling back to the previous one: ",
            "it is of the compressed stage (the switch after step ", m.freeze_step(),
            ") and lists no part of the ", m.num_servers(), " shards"));
        continue;
      }
      resume.set_servers_start_empty(true);
    }
    if (!differences.empty()) {
      resume.set_reset_errors(true);
      resume.set_reason(absl::StrCat("the checkpoint's topology differs (",
                                     absl::StrJoin(differences, ", "), ")"));
    }
    plan.resume = resume;
    plan.freeze_step = m.freeze_step();
    return plan;
  }
  return plan;
}

}  // namespace onebit::checkpoint
