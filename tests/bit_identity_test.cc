// The bits of whole jobs, pinned: each case runs a small job as real processes on loopback
// (coordinator, shards, workers) and compares a hash of every worker's final parameters with
// tests/golden/bit_identity.txt. A refactor that must not change results (a codec or an
// optimizer moved behind an interface, a kernel file split) keeps every hash; one that
// changes a result on purpose regenerates the file and says why in its commit.
//
// The cases cover the three optimizers and Adam, both codecs, the three exchange modes
// (hierarchical with one node and with two), a bf16 warmup wire, weight decay, an lr
// schedule, gradient clipping and the automatic momentum mask (fashion_mnist's always-zero
// border pixels), each freezing mid-run.
//
// The CPU kernels sum squares in a different order on AVX2 and on the scalar path
// (kernels/kernels.h), so the golden hashes are kept per path; a path with no hashes skips,
// saying so. To regenerate after a deliberate change, run this test with
//   --test_env=ONEBIT_UPDATE_GOLDEN=$PWD/tests/golden/bit_identity.txt
#include <sys/stat.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "config/job_config.h"
#include "deploy/local_job.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "tests/test_paths.h"

namespace onebit {
namespace {

struct Case {
  const char* name;
  int workers;
  // The job's "optimizer" block and the "onebit.exchange" block, as JSON.
  const char* optimizer;
  const char* exchange;
  const char* extra = "";  // more top-level keys, each followed by a comma
  const char* onebit_extra = "";  // more keys of the "onebit" block, each followed by a comma
  // A sharded case names its unsharded twin, listed before it: the two must end with the
  // same bits, in this run as in the golden file.
  const char* twin = nullptr;
};

// fashion_mnist with one hidden layer of 16: 12,730 parameters, and its first layer's rows
// for the image's border pixels get no gradient, so the momentum mask is exercised.
std::string JobJson(const Case& c) {
  return absl::StrFormat(R"({
  "train_micro_batch_size_per_gpu": 16,
  "steps": 24,
  "seed": 3,
  %s
  "optimizer": %s,
  "onebit": {
    %s
    "workers": %d,
    "exchange": %s,
    "freeze": {"mode": "static"},
    "lease_steps": 4,
    "log_every": 100,
    "workload": {"type": "fashion_mnist", "hidden": [16], "eval_every": 0}
  }
})",
                         c.extra, c.optimizer, c.onebit_extra, c.workers, c.exchange);
}

constexpr char kOnebitAdam[] =
    R"({"type": "OneBitAdam", "params": {"lr": 0.002, "freeze_step": 8, "weight_decay": 0.01}})";
constexpr char kOnebitAdamBias[] =
    R"({"type": "OneBitAdam", "params": {"lr": 0.002, "freeze_step": 8, "bias_correction": true}})";
constexpr char kZeroOneAdam[] =
    R"({"type": "ZeroOneAdam", "params": {"lr": 0.002, "var_freeze_step": 8,
        "var_update_scaler": 2, "local_step_scaler": 4, "local_step_clipper": 4}})";
constexpr char kOnebitLamb[] =
    R"({"type": "OneBitLamb", "params": {"lr": 0.002, "freeze_step": 8, "weight_decay": 0.01}})";
constexpr char kAdam[] = R"({"type": "Adam", "params": {"lr": 0.002, "weight_decay": 0.01}})";

constexpr char kPeer[] = R"({"mode": "peer"})";
constexpr char kPeerInt8[] = R"({"mode": "peer", "compressor": "int8"})";
constexpr char kPeerBf16[] = R"({"mode": "peer", "warmup_dtype": "bf16"})";
// The shards' own warmup (warmup_over "shards"; the default for the optimizers with one
// switch is "workers", kPsOverWorkers).
constexpr char kPs[] = R"({"mode": "ps", "servers": 2, "warmup_over": "shards"})";
constexpr char kPsInt8[] =
    R"({"mode": "ps", "servers": 2, "compressor": "int8", "warmup_over": "shards"})";
constexpr char kPsOverWorkers[] = R"({"mode": "ps", "servers": 3, "warmup_over": "workers"})";
constexpr char kHier[] = R"({"mode": "hierarchical", "local_size": 2})";
constexpr char kHierInt8[] = R"({"mode": "hierarchical", "local_size": 2, "compressor": "int8"})";
constexpr char kHierPs[] = R"({"mode": "hierarchical", "local_size": 2, "inter": "ps",
        "servers": 2, "warmup_over": "shards"})";
constexpr char kHierShard[] = R"({"mode": "hierarchical", "local_size": 2, "shard_state": true})";
constexpr char kHierShardInt8[] =
    R"({"mode": "hierarchical", "local_size": 2, "compressor": "int8", "shard_state": true})";
constexpr char kHierShardPs[] = R"({"mode": "hierarchical", "local_size": 2, "inter": "ps",
        "servers": 2, "shard_state": true, "warmup_over": "shards"})";

constexpr char kSchedule[] =
    R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5,
        "total_num_steps": 24, "warmup_max_lr": 0.003}},)";
constexpr char kClip[] = R"("gradient_clipping": 0.5,)";
constexpr char kScheduleClip[] =
    R"("scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5,
        "total_num_steps": 24, "warmup_max_lr": 0.003}}, "gradient_clipping": 0.5,)";
constexpr char kAutoMask[] = R"("momentum_mask": {"auto_zero_grad": true},)";

const std::vector<Case>& Cases() {
  static const auto* cases = new std::vector<Case>{
      {"peer_onebit_adam", 3, kOnebitAdam, kPeer},
      {"peer_onebit_adam_bias_schedule", 3, kOnebitAdamBias, kPeer, kSchedule},
      {"peer_onebit_adam_int8", 3, kOnebitAdam, kPeerInt8},
      {"peer_onebit_adam_bf16_clip", 3, kOnebitAdam, kPeerBf16, kClip},
      {"peer_zero_one_adam", 3, kZeroOneAdam, kPeer},
      {"peer_zero_one_adam_int8", 3, kZeroOneAdam, kPeerInt8},
      {"peer_onebit_lamb", 3, kOnebitLamb, kPeer, kSchedule},
      {"peer_onebit_lamb_int8", 3, kOnebitLamb, kPeerInt8},
      {"peer_adam", 3, kAdam, kPeer},
      {"ps_onebit_adam", 3, kOnebitAdam, kPs},
      {"ps_onebit_adam_int8", 3, kOnebitAdam, kPsInt8, kClip},
      {"ps_over_workers_onebit_adam", 3, kOnebitAdam, kPsOverWorkers},
      {"ps_zero_one_adam", 3, kZeroOneAdam, kPs},
      {"ps_onebit_lamb_int8", 3, kOnebitLamb, kPsInt8},
      {"hier_onebit_adam", 4, kOnebitAdam, kHier},
      {"hier_onebit_adam_int8", 4, kOnebitAdam, kHierInt8, kSchedule},
      {"hier_ps_onebit_adam", 4, kOnebitAdam, kHierPs},
      {"hier_zero_one_adam", 4, kZeroOneAdam, kHier},
      {"hier_onebit_lamb", 4, kOnebitLamb, kHierInt8},
      // The unsharded twins of issue 47's sharded cases: clipping in warmup and
      // compression, the automatic mask, a schedule, LAMB on the 1-bit codec, one node.
      {"hier_onebit_adam_clip_mask_schedule", 4, kOnebitAdam, kHier, kScheduleClip, kAutoMask},
      {"hier_adam", 4, kAdam, kHier},
      {"hier_onebit_lamb_clip_schedule", 4, kOnebitLamb, kHier, kScheduleClip},
      {"hier_one_node_onebit_lamb", 2, kOnebitLamb, kHier},
      // Sharded optimizer state (onebit.exchange.shard_state): the twin's bits.
      {"hier_shard_onebit_adam_clip_mask_schedule", 4, kOnebitAdam, kHierShard, kScheduleClip,
       kAutoMask, "hier_onebit_adam_clip_mask_schedule"},
      {"hier_shard_onebit_adam_int8", 4, kOnebitAdam, kHierShardInt8, kSchedule, "",
       "hier_onebit_adam_int8"},
      {"hier_shard_ps_onebit_adam", 4, kOnebitAdam, kHierShardPs, "", "", "hier_ps_onebit_adam"},
      {"hier_shard_adam", 4, kAdam, kHierShard, "", "", "hier_adam"},
      {"hier_shard_onebit_lamb", 4, kOnebitLamb, kHierShardInt8, "", "", "hier_onebit_lamb"},
      {"hier_shard_onebit_lamb_clip_schedule", 4, kOnebitLamb, kHierShard, kScheduleClip, "",
       "hier_onebit_lamb_clip_schedule"},
      {"hier_shard_one_node_onebit_lamb", 2, kOnebitLamb, kHierShard, "", "",
       "hier_one_node_onebit_lamb"},
  };
  return *cases;
}

// FNV-1a, 64 bits: a change detector, not a defence against anyone.
uint64_t Fnv1a(const std::string& bytes, uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string KernelPath() { return kernels::CpuHasAvx2() ? "avx2" : "scalar"; }

// "path case" -> hash, from the golden file (lines "avx2 peer_onebit_adam 0123abcd...").
std::map<std::string, std::string> ReadGolden(const std::string& path) {
  std::map<std::string, std::string> golden;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() == 3) golden[f[0] + " " + f[1]] = f[2];
  }
  return golden;
}

// Runs `c` to its end; returns the hash of the workers' final parameter files, in rank
// order, or "" after a failure (already reported).
std::string RunCase(const Case& c) {
  const std::string dir = absl::StrCat(testing_paths::TestTmpDir(), "/", c.name);
  mkdir(dir.c_str(), 0755);
  const std::string json = JobJson(c);
  auto config = ParseJobConfig(json);
  EXPECT_TRUE(config.ok()) << c.name << ": " << config.status() << "\n" << json;
  if (!config.ok()) return "";
  const std::string path = dir + "/job.json";
  std::ofstream(path) << json;
  launcher::LocalJobOptions options;
  options.bin_dir = testing_paths::RunfilesRoot();
  options.dir = dir;
  options.config_path = path;
  options.echo_all = false;
  options.worker_flags = {absl::StrCat("--params_out=", dir, "/params-{i}.npy")};
  options.coordinator_flags = {"--linger=0s"};
  launcher::LocalJob job(options, *config);
  const absl::Status started = job.Start();
  EXPECT_TRUE(started.ok()) << c.name << ": " << started;
  if (!started.ok()) return "";
  const absl::Status done = job.WaitForWorkers(absl::Seconds(180));
  job.Stop();
  EXPECT_TRUE(done.ok()) << c.name << ": " << done;
  if (!done.ok()) return "";
  uint64_t h = Fnv1a("");
  for (int i = 0; i < c.workers; ++i) {
    std::ifstream in(absl::StrCat(dir, "/params-", i, ".npy"), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    EXPECT_GT(bytes.str().size(), 12730u * 4) << c.name << ": worker " << i << "'s parameters";
    h = Fnv1a(bytes.str(), h);
  }
  return absl::StrFormat("%016x", h);
}

TEST(BitIdentityTest, EveryCaseKeepsItsBits) {
  const std::string update = testing_paths::Env("ONEBIT_UPDATE_GOLDEN");
  const std::string golden_path =
      update.empty() ? testing_paths::Runfile("tests/golden/bit_identity.txt") : update;
  const auto golden = ReadGolden(golden_path);
  const std::string kernel_path = KernelPath();
  bool have_any = false;
  for (const auto& [key, hash] : golden) have_any |= key.rfind(kernel_path + " ", 0) == 0;
  if (!have_any && update.empty()) {
    GTEST_SKIP() << "no golden hashes for the " << kernel_path << " CPU kernels in "
                 << golden_path << "; make them with ONEBIT_UPDATE_GOLDEN (see the file's top)";
  }
  std::map<std::string, std::string> out = golden;
  std::map<std::string, std::string> ran;  // case -> hash, this run
  for (const Case& c : Cases()) {
    const std::string key = kernel_path + " " + c.name;
    const std::string hash = RunCase(c);
    if (hash.empty()) continue;
    std::printf("%s %s\n", key.c_str(), hash.c_str());
    ran[c.name] = hash;
    if (c.twin != nullptr) {
      const auto twin = ran.find(c.twin);
      if (twin == ran.end()) {
        ADD_FAILURE() << c.name << ": its twin " << c.twin << " did not run before it";
      } else {
        EXPECT_EQ(hash, twin->second) << c.name << " ended apart from its twin " << c.twin;
      }
    }
    if (!update.empty()) {
      out[key] = hash;
      continue;
    }
    const auto it = golden.find(key);
    if (it == golden.end()) {
      ADD_FAILURE() << key << ": no golden hash (new case? regenerate the file)";
    } else {
      EXPECT_EQ(hash, it->second) << key << ": the final parameters changed";
    }
  }
  if (!update.empty()) {
    std::ofstream file(update);
    file << "# Hashes (FNV-1a 64) of every worker's final parameters, per CPU kernel path and\n"
            "# case of tests/bit_identity_test.cc. Regenerate only for a deliberate change.\n";
    for (const auto& [key, hash] : out) file << key << " " << hash << "\n";
    ASSERT_TRUE(file.good()) << "cannot write " << update;
  }
}

}  // namespace
}  // namespace onebit
