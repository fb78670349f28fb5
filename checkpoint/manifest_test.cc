#include "checkpoint/manifest.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "checkpoint/part.h"
#include "gtest/gtest.h"

namespace onebit::checkpoint {
namespace {

namespace fs = std::filesystem;

class ManifestTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
  }

  // A committed checkpoint of `step` with one worker part.
  v1::CheckpointManifest Commit(int64_t step) {
    absl::StatusOr<std::string> dir = MakeStepDir(root_, step);
    EXPECT_TRUE(dir.ok());
    Part part;
    part.Put("params", std::vector<float>(100, float(step)));
    absl::StatusOr<WrittenFile> w = WritePart(JoinPath(*dir, PartFileName(v1::ROLE_WORKER, 0)), part);
    EXPECT_TRUE(w.ok());
    v1::CheckpointManifest m;
    m.set_version(kManifestVersion);
    m.set_step(step);
    m.set_world_size(1);
    m.set_num_parameters(100);
    m.set_optimizer("OneBitAdam");
    m.set_exchange_mode("peer");
    m.set_freeze_step(5);
    v1::CheckpointPart* p = m.add_parts();
    p->set_role(v1::ROLE_WORKER);
    p->set_file(PartFileName(v1::ROLE_WORKER, 0));
    p->set_bytes(w->bytes);
    p->set_crc32(w->crc32);
    EXPECT_TRUE(WriteManifest(*dir, m).ok());
    return m;
  }

  std::string root_;
};

TEST_F(ManifestTest, Names) {
  EXPECT_EQ(StepDirName(10), "step-000000010");
  EXPECT_EQ(PartFileName(v1::ROLE_WORKER, 3), "worker-00003.part");
  EXPECT_EQ(PartFileName(v1::ROLE_SERVER, 1), "server-00001.part");
}

TEST_F(ManifestTest, CommittedCheckpointsAreListedAndVerify) {
  Commit(20);
  Commit(10);
  ASSERT_TRUE(MakeStepDir(root_, 30).ok());  // parts only, no manifest: does not exist
  std::vector<v1::CheckpointManifest> list = ListCommitted(root_);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].step(), 10);
  EXPECT_EQ(list[1].step(), 20);
  EXPECT_TRUE(VerifyCheckpoint(root_, list[1]).ok());
}

TEST_F(ManifestTest, CorruptOrTruncatedPartsFailVerification) {
  const v1::CheckpointManifest m = Commit(10);
  const std::string part = root_ + "/step-000000010/worker-00000.part";
  {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  absl::Status bad = VerifyCheckpoint(root_, m);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.message().find("checksum"), std::string::npos) << bad;
  ASSERT_EQ(truncate(part.c_str(), 10), 0);
  bad = VerifyCheckpoint(root_, m);
  EXPECT_NE(bad.message().find("bytes"), std::string::npos) << bad;
  fs::remove(part);
  EXPECT_NE(VerifyCheckpoint(root_, m).message().find("missing"), std::string::npos);
}

TEST_F(ManifestTest, BadManifestsAreSkippedWithAReason) {
  Commit(10);
  Commit(20);
  std::ofstream(root_ + "/step-000000020/MANIFEST.json") << "{\"version\": 1, \"step\": ";
  std::vector<std::string> skipped;
  std::vector<v1::CheckpointManifest> list = ListCommitted(root_, &skipped);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].step(), 10);
  ASSERT_EQ(skipped.size(), 1u);
  // A manifest that names a file outside its directory is not trusted.
  std::ofstream(root_ + "/step-000000010/MANIFEST.json")
      << R"({"version": 1, "step": "10", "parts": [{"file": "../../etc/passwd"}]})";
  EXPECT_EQ(ReadManifest(root_ + "/step-000000010").status().code(), absl::StatusCode::kDataLoss);
  // A manifest in the wrong directory neither.
  std::ofstream(root_ + "/step-000000010/MANIFEST.json") << R"({"version": 1, "step": "11"})";
  EXPECT_EQ(ReadManifest(root_ + "/step-000000010").status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(ManifestTest, RetentionAndCleanup) {
  for (int s : {10, 20, 30, 40}) Commit(s);
  ASSERT_TRUE(MakeStepDir(root_, 50).ok());
  ASSERT_TRUE(MakeStepDir(root_, 45).ok());
  EXPECT_EQ(RemoveUncommitted(root_, /*before_step=*/50), std::vector<std::string>{"step-000000045"});
  EXPECT_TRUE(fs::exists(root_ + "/step-000000050"));
  EXPECT_EQ(ApplyRetention(root_, 2),
            (std::vector<std::string>{"step-000000010", "step-000000020"}));
  std::vector<v1::CheckpointManifest> list = ListCommitted(root_);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].step(), 30);
  EXPECT_FALSE(fs::exists(root_ + "/step-000000010"));
}

TEST_F(ManifestTest, PlanResumeTakesTheNewestCheckpointThatVerifies) {
  JobConfig config;
  config.workers = 1;
  config.checkpoint.dir = root_;
  absl::StatusOr<ResumePlan> none = PlanResume(config, 100);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->resume.has_value());
  Commit(10);
  Commit(20);
  // Step 20's part is damaged: fall back to step 10, and say why.
  std::ofstream(root_ + "/step-000000020/worker-00000.part", std::ios::app) << "x";
  absl::StatusOr<ResumePlan> plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->resume.has_value());
  EXPECT_EQ(plan->resume->step(), 10);
  EXPECT_EQ(plan->resume->name(), "step-000000010");
  EXPECT_FALSE(plan->resume->reset_errors());
  EXPECT_EQ(plan->freeze_step, 5);
  ASSERT_EQ(plan->log.size(), 1u);
  EXPECT_NE(plan->log[0].find("step 20 is damaged"), std::string::npos) << plan->log[0];
  // Another topology: resume, but reset the errors and say why.
  config.workers = 2;
  plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->resume->reset_errors());
  EXPECT_NE(plan->resume->reason().find("workers 1 -> 2"), std::string::npos);
  // Another model: refuse, rather than start over silently.
  EXPECT_EQ(PlanResume(config, 101).status().code(), absl::StatusCode::kFailedPrecondition);
  config.checkpoint.resume = false;
  plan = PlanResume(config, 101);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->resume.has_value());
}

// ps with the warmup between the workers: a checkpoint of the warmup lists no shard part,
// and the shards resume it with a zero server error; one of the compressed stage without
// them is damaged.
TEST_F(ManifestTest, ACheckpointWithoutShardPartsIsResumedOnlyInTheWarmup) {
  JobConfig config;
  config.workers = 1;
  config.exchange.mode = "ps";
  config.exchange.servers = 2;
  config.exchange.warmup_over = "workers";
  config.checkpoint.dir = root_;
  auto commit = [&](int64_t step) {  // the workers' part only, the switch after step 5
    v1::CheckpointManifest m = Commit(step);
    m.set_num_servers(2);
    m.set_exchange_mode(TopologyKey(config));
    EXPECT_TRUE(WriteManifest(JoinPath(root_, StepDirName(step)), m).ok());
  };
  commit(5);
  absl::StatusOr<ResumePlan> plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->resume.has_value());
  EXPECT_EQ(plan->resume->step(), 5);
  EXPECT_TRUE(plan->resume->servers_start_empty());
  EXPECT_FALSE(plan->resume->reset_errors());
  commit(10);  // after the switch: the shards' parts are missing
  plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->resume->step(), 5);
  ASSERT_EQ(plan->log.size(), 1u);
  EXPECT_NE(plan->log[0].find("step 10 is damaged"), std::string::npos) << plan->log[0];
  EXPECT_NE(plan->log[0].find("lists no part of the 2 shards"), std::string::npos) << plan->log[0];
  // With its shards' parts listed, the same checkpoint is whole.
  fs::remove_all(JoinPath(root_, StepDirName(5)));
  v1::CheckpointManifest m = Commit(10);
  m.set_num_servers(1);
  m.set_exchange_mode(TopologyKey(config));
  const std::string dir = JoinPath(root_, StepDirName(10));
  Part server;
  server.Put("server_error", std::vector<float>(50, 0.5f));
  absl::StatusOr<WrittenFile> w = WritePart(JoinPath(dir, PartFileName(v1::ROLE_SERVER, 0)), server);
  ASSERT_TRUE(w.ok());
  v1::CheckpointPart* p = m.add_parts();
  p->set_role(v1::ROLE_SERVER);
  p->set_file(PartFileName(v1::ROLE_SERVER, 0));
  p->set_bytes(w->bytes);
  p->set_crc32(w->crc32);
  ASSERT_TRUE(WriteManifest(dir, m).ok());
  plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->resume->step(), 10);
  EXPECT_FALSE(plan->resume->servers_start_empty());
}

TEST_F(ManifestTest, TopologyKeys) {
  JobConfig c;
  EXPECT_EQ(TopologyKey(c), "peer");
  c.exchange.mode = "ps";
  c.exchange.servers = 2;
  EXPECT_EQ(TopologyKey(c), "ps servers=2");
  c.exchange.mode = "hierarchical";
  c.exchange.local_size = 2;
  c.exchange.inter = "ps";
  EXPECT_EQ(TopologyKey(c), "hierarchical local_size=2 inter=ps servers=2");
  c.exchange.compressor = "int8";  // another compressor's error buffers do not carry over
  EXPECT_EQ(TopologyKey(c), "hierarchical local_size=2 inter=ps servers=2 compressor=int8");
  c.exchange.mode = "peer";
  EXPECT_EQ(TopologyKey(c), "peer compressor=int8");
}

// Sharded state keeps the error buffers per slice, as unsharded does: the two resume each
// other's checkpoints with their errors. Another local size cuts the slices (and the
// errors) anew: the parts' global ranges reshard p, m and v, and the errors reset.
TEST_F(ManifestTest, ShardingKeepsTheTopologyAndTheLocalSizeChangesIt) {
  JobConfig config;
  config.workers = 1;
  config.exchange.mode = "hierarchical";
  config.exchange.local_size = 4;
  config.checkpoint.dir = root_;
  v1::CheckpointManifest m = Commit(10);
  m.set_exchange_mode(TopologyKey(config));
  ASSERT_TRUE(WriteManifest(JoinPath(root_, StepDirName(10)), m).ok());
  config.exchange.shard_state = true;
  absl::StatusOr<ResumePlan> plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->resume.has_value());
  EXPECT_FALSE(plan->resume->reset_errors()) << plan->resume->reason();
  config.exchange.local_size = 2;
  plan = PlanResume(config, 100);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->resume.has_value());
  EXPECT_EQ(plan->resume->step(), 10);
  EXPECT_TRUE(plan->resume->reset_errors());
  EXPECT_NE(plan->resume->reason().find("local_size=4 inter=peer' -> 'hierarchical local_size=2"),
            std::string::npos)
      << plan->resume->reason();
}

}  // namespace
}  // namespace onebit::checkpoint
