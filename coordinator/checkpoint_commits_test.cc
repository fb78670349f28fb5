#include "coordinator/checkpoint_commits.h"

#include <optional>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
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
  // Adds a part as the coordinator does: AddPart, and for the last part Write and Finish.
  static absl::StatusOr<v1::CommitPartResponse> Add(CheckpointCommits& c, int64_t step,
                                                    const v1::CheckpointPart& part,
                                                    const CheckpointFacts& f, bool* committed) {
    *committed = false;
    std::optional<ManifestWrite> write;
    absl::StatusOr<v1::CommitPartResponse> response = c.AddPart(step, part, f, &write);
    if (!response.ok() || !write.has_value()) return response;
    c.Write(&*write);
    return c.Finish(*write, f, committed);
  }
  // Adds every part of `step`'s checkpoint but stops before its manifest is written: the
  // write the last part handed out.
  static std::optional<ManifestWrite> Unwritten(CheckpointCommits& c, int64_t step,
                                                const CheckpointFacts& f) {
    bool committed = false;
    EXPECT_TRUE(Add(c, step, Part(v1::ROLE_WORKER, 0), f, &committed).ok());
    EXPECT_TRUE(Add(c, step, Part(v1::ROLE_WORKER, 1), f, &committed).ok());
    std::optional<ManifestWrite> write;
    EXPECT_TRUE(c.AddPart(step, Part(v1::ROLE_SERVER, 0), f, &write).ok());
    EXPECT_TRUE(write.has_value());
    return write;
  }
  // Adds every part of `step`'s checkpoint; true when the last one committed it.
  bool AddAll(CheckpointCommits& c, int64_t step, const CheckpointFacts& f, bool servers = true) {
    bool committed = false;
    for (int r = 0; r < f.world_size; ++r) {
      EXPECT_TRUE(Add(c, step, Part(v1::ROLE_WORKER, r), f, &committed).ok());
    }
    for (int s = 0; servers && s < f.num_servers; ++s) {
      EXPECT_TRUE(Add(c, step, Part(v1::ROLE_SERVER, s), f, &committed).ok());
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
  EXPECT_EQ(Add(c, 3, Part(v1::ROLE_WORKER, 0), f, &committed).status().code(),
            absl::StatusCode::kInvalidArgument);  // no checkpoint after step 3
  ASSERT_TRUE(Add(c, 5, Part(v1::ROLE_WORKER, 0), f, &committed).ok());
  EXPECT_FALSE(committed);
  EXPECT_TRUE(c.has_pending());
  ASSERT_TRUE(Add(c, 5, Part(v1::ROLE_WORKER, 1), f, &committed).ok());
  EXPECT_FALSE(committed);  // the shard's part is still missing
  auto last = Add(c, 5, Part(v1::ROLE_SERVER, 0), f, &committed);
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
  last = Add(c, 5, Part(v1::ROLE_WORKER, 1), f, &committed);
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
  EXPECT_EQ(Add(c, 5, Part(v1::ROLE_SERVER, 0), f, &committed).status().code(),
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
  ASSERT_TRUE(Add(c, 5, Part(v1::ROLE_WORKER, 0), f, &committed).ok());
  ASSERT_TRUE(Add(c, 5, Part(v1::ROLE_WORKER, 1), f, &committed).ok());
  fail_ = true;
  EXPECT_EQ(Add(c, 5, Part(v1::ROLE_SERVER, 0), f, &committed).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE(committed);
  EXPECT_FALSE(c.has_pending());
  EXPECT_EQ(c.last_committed_step(), 0);
}

// Between the last part and Finish the manifest is being written (without the
// coordinator's lock): the step is pending, listed as complete but not committed, and a
// retried part of it is answered "not committed" without writing a second manifest.
TEST_F(CheckpointCommitsTest, WhileItsManifestIsWrittenAStepIsPending) {
  CheckpointCommits c = Make();
  const CheckpointFacts f = Facts();
  bool committed = false;
  std::optional<ManifestWrite> write = Unwritten(c, 5, f);
  EXPECT_EQ(write->manifest.parts_size(), 3);
  EXPECT_TRUE(written_.empty());  // AddPart writes nothing
  EXPECT_TRUE(c.has_pending());   // the job is not finished before the manifest
  v1::ListCheckpointsResponse list = c.List(f);
  ASSERT_EQ(list.checkpoints_size(), 1);
  EXPECT_FALSE(list.checkpoints(0).committed());
  EXPECT_EQ(list.checkpoints(0).parts_done(), 3);
  std::optional<ManifestWrite> again;
  absl::StatusOr<v1::CommitPartResponse> retry = c.AddPart(5, Part(v1::ROLE_WORKER, 1), f, &again);
  ASSERT_TRUE(retry.ok());
  EXPECT_FALSE(retry->committed());
  EXPECT_FALSE(again.has_value());
  c.Write(&*write);
  ASSERT_TRUE(write->written.ok());
  EXPECT_EQ(written_.size(), 1u);
  EXPECT_EQ(c.last_committed_step(), 0);  // not before Finish
  absl::StatusOr<v1::CommitPartResponse> done = c.Finish(*write, f, &committed);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->committed());
  EXPECT_TRUE(committed);
  EXPECT_EQ(c.last_committed_step(), 5);
  EXPECT_FALSE(c.has_pending());
}

// A recovery that begins before the manifest is written: it is never written (as if the
// coordinator had crashed between the parts and the manifest), and the last part is told.
TEST_F(CheckpointCommitsTest, ARecoveryBeforeTheManifestKeepsItUnwritten) {
  CheckpointCommits c = Make();
  const CheckpointFacts f = Facts();
  bool committed = false;
  std::optional<ManifestWrite> write = Unwritten(c, 5, f);
  c.BeginRecovery();
  c.ClearPending();
  c.Write(&*write);
  EXPECT_EQ(write->written.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(written_.empty());
  EXPECT_EQ(c.Finish(*write, f, &committed).status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(committed);
  EXPECT_EQ(c.last_committed_step(), 0);
  EXPECT_FALSE(c.has_pending());
}

// A manifest written before a recovery read the disk: the recovery counts it (SetFound),
// and Finish adds nothing twice.
TEST_F(CheckpointCommitsTest, AManifestWrittenBeforeARecoveryCountsFromTheDisk) {
  CheckpointCommits c = Make();
  const CheckpointFacts f = Facts();
  bool committed = false;
  std::optional<ManifestWrite> write = Unwritten(c, 5, f);
  c.Write(&*write);
  ASSERT_TRUE(write->written.ok());
  c.BeginRecovery();
  c.ClearPending();
  c.SetFound(written_);
  absl::StatusOr<v1::CommitPartResponse> done = c.Finish(*write, f, &committed);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->committed());
  EXPECT_FALSE(committed);  // the recovery's, not this generation's
  ASSERT_EQ(c.List(f).checkpoints_size(), 1);
  EXPECT_EQ(c.last_committed_step(), 5);
}

// A recovery waits for a manifest being written, so that it reads the disk after it.
TEST_F(CheckpointCommitsTest, ARecoveryWaitsForTheManifestBeingWritten) {
  absl::Notification entered, release;
  CheckpointCommitsOptions o;
  o.keep = 2;
  o.commit = [&](const v1::CheckpointManifest&) {
    entered.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  };
  CheckpointCommits c(o, &clock_, nullptr);
  const CheckpointFacts f = Facts();
  bool committed = false;
  std::optional<ManifestWrite> write = Unwritten(c, 5, f);
  std::thread writer([&] { c.Write(&*write); });
  entered.WaitForNotification();
  absl::Notification recovered;
  std::thread recovery([&] {
    c.BeginRecovery();
    recovered.Notify();
  });
  EXPECT_FALSE(recovered.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  release.Notify();
  recovery.join();
  writer.join();
  EXPECT_TRUE(recovered.HasBeenNotified());
  EXPECT_TRUE(write->written.ok());
}

// Two manifests whose writes finish out of order: the older one is answered committed
// (its manifest exists) but never listed after the newer.
TEST_F(CheckpointCommitsTest, AnOlderManifestFinishedLastIsSuperseded) {
  CheckpointCommits c = Make();
  const CheckpointFacts f = Facts();
  std::optional<ManifestWrite> first = Unwritten(c, 5, f), second = Unwritten(c, 10, f);
  bool committed = false;
  c.Write(&*second);
  ASSERT_TRUE(c.Finish(*second, f, &committed).ok());
  EXPECT_TRUE(committed);
  c.Write(&*first);
  absl::StatusOr<v1::CommitPartResponse> late = c.Finish(*first, f, &committed);
  ASSERT_TRUE(late.ok());
  EXPECT_TRUE(late->committed());
  EXPECT_FALSE(committed);
  ASSERT_EQ(c.List(f).checkpoints_size(), 1);
  EXPECT_EQ(c.last_committed_step(), 10);
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
