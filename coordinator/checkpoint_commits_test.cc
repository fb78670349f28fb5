#include "coordinator/checkpoint_commits.h"

#include <vector>

#include "checkpoint/manifest.h"
#include "gtest/gtest.h"

namespace onebit {
namespace {

v1::CheckpointPart Part(v1::Role role, int rank) {
  v1::CheckpointPart p;
  p.set_role(role);
  p.set_rank(rank);
  p.set_file(checkpoint::PartFileName(role, rank));
  p.set_bytes(100);
  return p;
}

CheckpointFacts Facts() {
  CheckpointFacts f;
  f.world_size = 2;
  f.num_servers = 1;
  f.freeze_step = 4;
  f.checkpoint_every = 5;
  f.num_parameters = 10;
  return f;
}

class CheckpointCommitsTest : public ::testing::Test {
 protected:
  CheckpointCommits Make(int keep = 2) {
    CheckpointCommitsOptions o;
    o.job_id = "job";
    o.topology = "peer";
    o.optimizer = "OneBitAdam";
    o.keep = keep;
    o.commit = [this](const v1::CheckpointManifest& m) {
      if (fail_) return absl::UnavailableError("disk full");
      written_.push_back(m);
      return absl::OkStatus();
    };
    return CheckpointCommits(o, &clock_, nullptr);
  }
  // Adds every part of `step`'s checkpoint; true when the last one committed it.
  bool AddAll(CheckpointCommits& c, int64_t step, const CheckpointFacts& f, bool servers = true) {
    bool committed = false;
    for (int r = 0; r < f.world_size; ++r) {
      EXPECT_TRUE(c.AddPart(step, Part(v1::ROLE_WORKER, r), f, &committed).ok());
    }
    for (int s = 0; servers && s < f.num_servers; ++s) {
      EXPECT_TRUE(c.AddPart(step, Part(v1::ROLE_SERVER, s), f, &committed).ok());
    }
    return committed;
  }
  FakeClock clock_;
  bool fail_ = false;
  std::vector<v1::CheckpointManifest> written_;
};

TEST_F(CheckpointCommitsTest, PartsAreCheckedOnTheirFace) {
  EXPECT_TRUE(CheckpointCommits::ValidatePart(Part(v1::ROLE_WORKER, 3)).ok());
  v1::CheckpointPart p = Part(v1::ROLE_WORKER, 3);
  p.set_file("../elsewhere");
  EXPECT_EQ(CheckpointCommits::ValidatePart(p).code(), absl::StatusCode::kInvalidArgument);
  p = Part(v1::ROLE_SERVER, 0);
  p.set_bytes(0);
  EXPECT_EQ(CheckpointCommits::ValidatePart(p).code(), absl::StatusCode::kInvalidArgument);
  p.set_role(v1::ROLE_UNSPECIFIED);
  EXPECT_EQ(CheckpointCommits::ValidatePart(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointCommitsTest, TheLastPartWritesTheManifest) {
  CheckpointCommits c = Make();
  const CheckpointFacts f = Facts();
  bool committed = false;
  EXPECT_EQ(c.AddPart(3, Part(v1::ROLE_WORKER, 0), f, &committed).status().code(),
            absl::StatusCode::kInvalidArgument);  // no checkpoint after step 3
  ASSERT_TRUE(c.AddPart(5, Part(v1::ROLE_WORKER, 0), f, &committed).ok());
  EXPECT_FALSE(committed);
  EXPECT_TRUE(c.has_pending());
  ASSERT_TRUE(c.AddPart(5, Part(v1::ROLE_WORKER, 1), f, &committed).ok());
  EXPECT_FALSE(committed);  // the shard's part is still missing
  auto last = c.AddPart(5, Part(v1::ROLE_SERVER, 0), f, &committed);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(committed);
  EXPECT_TRUE(last->committed());
  ASSERT_EQ(written_.size(), 1u);
  EXPECT_EQ(written_[0].step(), 5);
  EXPECT_EQ(written_[0].parts_size(), 3);
  EXPECT_EQ(written_[0].reason(), "every 5 steps");
  EXPECT_EQ(written_[0].optimizer(), "OneBitAdam");
  EXPECT_EQ(c.last_committed_step(), 5);
  EXPECT_FALSE(c.has_pending());
  // A retry after the manifest is answered "committed" and writes nothing.
  last = c.AddPart(5, Part(v1::ROLE_WORKER, 1), f, &committed);
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->committed());
  EXPECT_FALSE(committed);
  EXPECT_EQ(written_.size(), 1u);
}

TEST_F(CheckpointCommitsTest, AWarmupBetweenTheWorkersHasNoShardParts) {
  CheckpointCommits c = Make();
  CheckpointFacts f = Facts();
  f.shards_skip_warmup = true;
  f.freeze_step = 7;  // step 5 is in the warmup
  bool committed = false;
  EXPECT_EQ(c.AddPart(5, Part(v1::ROLE_SERVER, 0), f, &committed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(AddAll(c, 5, f, /*servers=*/false));
  EXPECT_EQ(written_.back().parts_size(), 2);
  EXPECT_TRUE(AddAll(c, 10, f));  // after the switch the shards' parts are expected
  EXPECT_EQ(written_.back().parts_size(), 3);
}

TEST_F(CheckpointCommitsTest, RetentionAndForgettingKeepTheNewest) {
  CheckpointCommits c = Make(/*keep=*/2);
  const CheckpointFacts f = Facts();
  for (int64_t step : {5, 10, 15}) EXPECT_TRUE(AddAll(c, step, f));
  v1::ListCheckpointsResponse list = c.List(f);
  ASSERT_EQ(list.checkpoints_size(), 2);
  EXPECT_EQ(list.checkpoints(0).step(), 10);
  EXPECT_EQ(list.checkpoints(1).step(), 15);
  c.ForgetAfter(12);
  EXPECT_EQ(c.last_committed_step(), 10);
}

TEST_F(CheckpointCommitsTest, AFailedCommitDropsTheParts) {
  CheckpointCommits c = Make();
  const CheckpointFacts f = Facts();
  bool committed = false;
  ASSERT_TRUE(c.AddPart(5, Part(v1::ROLE_WORKER, 0), f, &committed).ok());
  ASSERT_TRUE(c.AddPart(5, Part(v1::ROLE_WORKER, 1), f, &committed).ok());
  fail_ = true;
  EXPECT_EQ(c.AddPart(5, Part(v1::ROLE_SERVER, 0), f, &committed).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(committed);
  EXPECT_FALSE(c.has_pending());
  EXPECT_EQ(c.last_committed_step(), 0);
}

TEST_F(CheckpointCommitsTest, AnOperatorsRequestIsListedUntilItStarts) {
  CheckpointCommits c = Make();
  CheckpointFacts f = Facts();
  const v1::CheckpointInfo info = c.Request(7, f);
  EXPECT_EQ(info.reason(), "operator");
  EXPECT_EQ(info.parts_expected(), 3);
  EXPECT_EQ(c.Reason(7, f), "operator");
  ASSERT_EQ(c.List(f).checkpoints_size(), 1);
  c.ClearPending();
  EXPECT_EQ(c.Reason(7, f), "");
  EXPECT_EQ(c.List(f).checkpoints_size(), 0);
}

TEST_F(CheckpointCommitsTest, WithoutACommitTheJobTakesNoCheckpoints) {
  CheckpointCommits c(CheckpointCommitsOptions{}, &clock_, nullptr);
  EXPECT_FALSE(c.enabled());
  EXPECT_EQ(c.CheckEnabled().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace onebit
