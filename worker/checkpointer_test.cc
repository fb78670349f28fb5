// The worker's checkpoint parts as files: the trainer's scalars (fp16's loss scaler) are
// written with the optimizer's state and read back from any worker's part, so a worker of
// a larger resumed world (without a part of its own) gets them too. Sharded state: the
// parts cover the parameters once, resume either mode from the other's checkpoint, and
// reshard on another local size.
#include "worker/checkpointer.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/manifest.h"
#include "checkpoint/part.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "worker/exchange/hierarchical_exchange.h"
#include "worker/exchange/peer_exchange.h"
#include "worker/optim/optimizer_factory.h"
#include "worker/transport/inproc_transport.h"
#include "worker/transport/local_group.h"

namespace onebit {
namespace {

constexpr size_t kN = 37;
constexpr int64_t kStep = 3;

std::vector<float> Grad(int rank, int64_t t) {
  std::vector<float> g(kN);
  for (size_t i = 0; i < kN; ++i) g[i] = 0.01f * static_cast<float>((i * 7 + rank * 3 + t) % 11) - 0.05f;
  return g;
}

OptimizerSpec Spec() {
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kOneBitAdam;
  spec.freeze_step = 2;
  return spec;
}

TEST(CheckpointerTest, TrainerScalarsRoundTripThroughTheParts) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/ckpt";
  const StateScalars trainer = {{"loss_scale", 64.0}, {"loss_scale_updates", 3.0}};
  std::vector<std::vector<float>> params(2);
  const absl::Status saved =
      RunLocalGroup(TransportKind::kInproc, 2, [&](Transport& t) -> absl::Status {
        auto backend = kernels::NewCpuBackend();
        ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<PeerExchange> exchange,
                                PeerExchange::Create(backend.get(), &t, kN));
        const std::vector<float> initial(kN, 0.5f);
        ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> o,
                                CreateOptimizer(Spec(), backend.get(), exchange.get(),
                                                initial.data(), kN));
        for (int64_t step = 1; step <= kStep; ++step) {
          const std::vector<float> g = Grad(t.rank(), step);
          ONEBIT_RETURN_IF_ERROR(o->Step(g.data()));
        }
        CheckpointerOptions options;
        options.dir = root;
        options.rank = t.rank();
        options.world_size = 2;
        WorkerCheckpointer checkpointer(options, /*client=*/nullptr);
        ONEBIT_RETURN_IF_ERROR(checkpointer.Save(kStep, *o, trainer));
        ONEBIT_ASSIGN_OR_RETURN(params[t.rank()], o->ParamsToHost());
        return absl::OkStatus();
      });
  ASSERT_TRUE(saved.ok()) << saved;
  ASSERT_EQ(params[0], params[1]);

  // What the coordinator writes once both parts are in.
  v1::CheckpointManifest manifest;
  manifest.set_version(checkpoint::kManifestVersion);
  manifest.set_step(kStep);
  manifest.set_freeze_step(2);
  manifest.set_world_size(2);
  manifest.set_num_parameters(kN);
  for (int rank = 0; rank < 2; ++rank) {
    v1::CheckpointPart* part = manifest.add_parts();
    part->set_role(v1::ROLE_WORKER);
    part->set_rank(rank);
    part->set_file(checkpoint::PartFileName(v1::ROLE_WORKER, rank));
  }
  const std::string dir = checkpoint::JoinPath(root, checkpoint::StepDirName(kStep));
  ASSERT_TRUE(checkpoint::WriteManifest(dir, manifest).ok());

  // Rank 0 of the same world, and rank 2 of a world of 3 (no part of its own: errors reset).
  for (int rank : {0, 2}) {
    SCOPED_TRACE(testing::Message() << "rank " << rank);
    auto hub = InprocHub::Create(1);
    ASSERT_TRUE(hub.ok());
    auto transport = (*hub)->Connect(0);
    ASSERT_TRUE(transport.ok());
    auto backend = kernels::NewCpuBackend();
    auto exchange = PeerExchange::Create(backend.get(), transport->get(), kN);
    ASSERT_TRUE(exchange.ok());
    const std::vector<float> initial(kN, 0.0f);
    auto o = CreateOptimizer(Spec(), backend.get(), exchange->get(), initial.data(), kN);
    ASSERT_TRUE(o.ok());
    v1::ResumeFrom resume;
    resume.set_step(kStep);
    resume.set_reset_errors(true);
    StateScalars got;
    const absl::Status restored = RestoreWorker(root, resume, rank, **o, &got);
    ASSERT_TRUE(restored.ok()) << restored;
    EXPECT_EQ(got, trainer);
    EXPECT_EQ(*(*o)->ParamsToHost(), params[0]);
    EXPECT_EQ((*o)->step(), kStep);
  }
}


// SHARDED STATE (Exchange::state_shard): hierarchical jobs of nodes x local workers as
// threads, OnebitAdam with the automatic momentum mask (so "nonzero_seen" is a shared
// tensor too), a checkpoint after step kSave (compression stage: the error buffers count).
constexpr int64_t kFreeze = 4;
constexpr int64_t kSave = 6;
constexpr int64_t kEnd = 9;

std::string StepDir(const std::string& root) {
  return checkpoint::JoinPath(root, checkpoint::StepDirName(kSave));
}

struct Job {
  int nodes;
  int local;
  bool shard;
  OptimizerKind kind = OptimizerKind::kOneBitAdam;
};

std::string JobName(const Job& job) {
  return absl::StrCat(job.kind == OptimizerKind::kOneBitLamb ? "1-bit LAMB " : "1-bit Adam ",
                      job.nodes, "x", job.local, job.shard ? " sharded" : " unsharded");
}

OptimizerSpec MaskedSpec(OptimizerKind kind) {
  OptimizerSpec spec;
  spec.kind = kind;
  spec.freeze_step = kFreeze;
  spec.auto_mask_zero_gradients = true;
  return spec;
}

std::vector<float> JobGrad(int worker, int64_t step, size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = i % 13 == 5 ? 0.0f : std::sin(0.01f * i + 0.1f * step) + 0.05f * worker;
  }
  return g;
}

// Runs body(worker, optimizer) on every worker of `job`, each with a fresh optimizer at
// the same initial parameters.
absl::Status RunJob(const Job& job, size_t n,
                    const std::function<absl::Status(int, Optimizer&)>& body) {
  return RunLocalNodes(
      TransportKind::kInproc, job.nodes, job.local,
      [&](Transport& intra, Transport& inter) -> absl::Status {
        const int w = inter.rank() * job.local + intra.rank();
        auto backend = kernels::NewCpuBackend();
        HierarchicalOptions options;
        options.shard_state = job.shard;
        ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<HierarchicalExchange> exchange,
                                HierarchicalExchange::CreatePeer(backend.get(), &intra, &inter, n,
                                                                 OnebitCodec(), options));
        std::vector<float> initial(n);
        for (size_t i = 0; i < n; ++i) initial[i] = std::cos(0.3f * i);
        ONEBIT_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> o,
                                CreateOptimizer(MaskedSpec(job.kind), backend.get(),
                                                exchange.get(), initial.data(), n));
        return body(w, *o);
      });
}

absl::Status Train(Optimizer& o, int worker, int64_t last) {
  while (o.step() < last) {
    const std::vector<float> g = JobGrad(worker, o.step() + 1, o.size());
    ONEBIT_RETURN_IF_ERROR(o.Step(g.data()));
  }
  return absl::OkStatus();
}

absl::Status SavePart(const std::string& root, int worker, int world_size, Optimizer& o) {
  CheckpointerOptions options;
  options.dir = root;
  options.rank = worker;
  options.world_size = world_size;
  WorkerCheckpointer checkpointer(options, /*client=*/nullptr);
  return checkpointer.Save(o.step(), o, {});
}

// What the coordinator writes once the parts of world_size workers are in.
void Commit(const std::string& root, int world_size, size_t n) {
  v1::CheckpointManifest manifest;
  manifest.set_version(checkpoint::kManifestVersion);
  manifest.set_step(kSave);
  manifest.set_freeze_step(kFreeze);
  manifest.set_world_size(world_size);
  manifest.set_num_parameters(n);
  for (int rank = 0; rank < world_size; ++rank) {
    v1::CheckpointPart* part = manifest.add_parts();
    part->set_role(v1::ROLE_WORKER);
    part->set_rank(rank);
    part->set_file(checkpoint::PartFileName(v1::ROLE_WORKER, rank));
  }
  ASSERT_TRUE(checkpoint::WriteManifest(StepDir(root), manifest).ok());
}

// Every state tensor of an unsharded worker, whole, by name.
absl::StatusOr<StateTensors> WholeStates(const Optimizer& o) {
  StateTensors states;
  for (const StateSpec& spec : o.CheckpointStates()) {
    ONEBIT_ASSIGN_OR_RETURN(states[spec.name], o.StateToHost(spec.name, 0, o.size()));
  }
  return states;
}

bool SameBits(const std::vector<float>& a, const float* b) {
  return a.empty() || std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
}

// The job's state after kSave (every worker of an unsharded job holds all of it), and each
// worker's parameters after kEnd, uninterrupted; a checkpoint of kSave under `root`.
struct Reference {
  StateTensors at_save;
  std::vector<std::vector<float>> end;
};
Reference RunAndSave(const Job& job, size_t n, const std::string& root) {
  Reference ref;
  const int world = job.nodes * job.local;
  ref.end.resize(world);
  absl::Mutex mu;
  const absl::Status run = RunJob(job, n, [&](int w, Optimizer& o) -> absl::Status {
    ONEBIT_RETURN_IF_ERROR(Train(o, w, kSave));
    ONEBIT_RETURN_IF_ERROR(SavePart(root, w, world, o));
    if (!job.shard && w == 0) {
      ONEBIT_ASSIGN_OR_RETURN(StateTensors states, WholeStates(o));
      absl::MutexLock lock(&mu);
      ref.at_save = std::move(states);
    }
    ONEBIT_RETURN_IF_ERROR(Train(o, w, kEnd));
    ONEBIT_ASSIGN_OR_RETURN(ref.end[w], o.ParamsToHost());
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << JobName(job) << ": " << run;
  Commit(root, world, n);
  return ref;
}

// Each worker restored from `root` (errors kept unless `reset_errors`): its step, its
// parameters, and its state range's tensors against `whole` (every tensor of the
// checkpoint, whole); with `reset_errors`, zero error buffers. Then trained to kEnd: each
// worker's parameters.
std::vector<std::vector<float>> RestoreAndCheck(const Job& job, size_t n,
                                                const std::string& root, bool reset_errors,
                                                const StateTensors& whole) {
  std::vector<std::vector<float>> end(job.nodes * job.local);
  const absl::Status run = RunJob(job, n, [&](int w, Optimizer& o) -> absl::Status {
    v1::ResumeFrom resume;
    resume.set_step(kSave);
    resume.set_reset_errors(reset_errors);
    ONEBIT_RETURN_IF_ERROR(RestoreWorker(root, resume, w, o));
    EXPECT_EQ(o.step(), kSave);
    const size_t lo = o.state_begin(), hi = lo + o.state_count();
    EXPECT_EQ(o.state_count() < n, job.shard && job.local > 1);
    for (const StateSpec& spec : o.CheckpointStates()) {
      ONEBIT_ASSIGN_OR_RETURN(std::vector<float> got, o.StateToHost(spec.name, lo, hi));
      auto it = whole.find(spec.name);
      if (it == whole.end() || it->second.size() != n) {
        return absl::InternalError(absl::StrCat("no whole ", spec.name));
      }
      EXPECT_TRUE(SameBits(got, it->second.data() + lo))
          << JobName(job) << ", worker " << w << ": " << spec.name << " [" << lo << ", " << hi
          << ")";
    }
    ONEBIT_ASSIGN_OR_RETURN(std::vector<float> p, o.ParamsToHost());
    EXPECT_TRUE(SameBits(p, whole.at("params").data())) << JobName(job) << ", worker " << w;
    if (reset_errors) {
      ONEBIT_ASSIGN_OR_RETURN(ErrorState errors, o.exchange().SaveErrors());
      for (const auto& [name, values] : errors) {
        EXPECT_EQ(values, std::vector<float>(values.size(), 0.0f))
            << "worker " << w << ": " << name;
      }
    }
    ONEBIT_RETURN_IF_ERROR(Train(o, w, kEnd));
    ONEBIT_ASSIGN_OR_RETURN(end[w], o.ParamsToHost());
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << JobName(job) << ": " << run;
  return end;
}

// The parts' [slice_begin, slice_end) cover [0, n) exactly once, and each part's shared
// tensors are `whole`'s elements there.
void ExpectPartsCoverOnce(const std::string& root, int world_size, size_t n,
                          const StateTensors& whole) {
  std::vector<int> holders(n, 0);
  for (int rank = 0; rank < world_size; ++rank) {
    SCOPED_TRACE(testing::Message() << "part of worker " << rank);
    const absl::StatusOr<checkpoint::Part> part = checkpoint::ReadPart(
        checkpoint::JoinPath(StepDir(root), checkpoint::PartFileName(v1::ROLE_WORKER, rank)));
    ASSERT_TRUE(part.ok()) << part.status();
    const int64_t begin = *part->MetaInt("slice_begin"), end = *part->MetaInt("slice_end");
    ASSERT_LE(0, begin);
    ASSERT_LE(begin, end);
    ASSERT_LE(end, static_cast<int64_t>(n));
    for (int64_t i = begin; i < end; ++i) ++holders[i];
    for (const auto& [name, values] : whole) {
      const absl::StatusOr<const checkpoint::Tensor*> t = part->Get(name);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_EQ((*t)->data.size(), static_cast<size_t>(end - begin)) << name;
      EXPECT_TRUE(SameBits((*t)->data, values.data() + begin)) << name;
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(holders[i], 1) << "element " << i;
}

// Sharded and unsharded checkpoints hold the same bits in the same layout of global
// ranges, and each resumes the other to the bits of the uninterrupted run: the error
// buffers are per slice in both modes, so the topology (and its key) is the same. 1-bit
// LAMB adds a shared tensor (exp_avg_sq_fresh) and scalars per group.
TEST(CheckpointerShardedTest, ShardedAndUnshardedResumeEachOther) {
  constexpr size_t kLarge = 1001;
  for (OptimizerKind kind : {OptimizerKind::kOneBitAdam, OptimizerKind::kOneBitLamb}) {
    const Job whole{2, 2, false, kind}, sharded{2, 2, true, kind};
    SCOPED_TRACE(JobName(sharded));
    const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/either-",
                                          static_cast<int>(kind));
    const Reference ref = RunAndSave(whole, kLarge, root + "/unsharded");
    const Reference ref_sharded = RunAndSave(sharded, kLarge, root + "/sharded");
    ASSERT_FALSE(ref.at_save.empty());
    EXPECT_EQ(ref_sharded.end, ref.end) << "the sharded run is not the unsharded one";
    ExpectPartsCoverOnce(root + "/sharded", 4, kLarge, ref.at_save);
    EXPECT_EQ(RestoreAndCheck(sharded, kLarge, root + "/unsharded", false, ref.at_save), ref.end);
    EXPECT_EQ(RestoreAndCheck(whole, kLarge, root + "/sharded", false, ref.at_save), ref.end);
  }
}

// A checkpoint of local size 4 resumes at local size 2, sharded or not: p and the shared
// tensors exact, the error buffers zero (the coordinator resets them: TopologyKey holds
// the local size). With n = 37 and 4 local workers, worker 3's slice is all padding: its
// part holds an empty slice, which no worker's state range overlaps, so no worker reads
// more than its head (its damaged checksum goes unseen).
TEST(CheckpointerShardedTest, ResumesOnAnotherLocalSize) {
  constexpr size_t kSmall = 37;
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/local4";
  const Reference ref = RunAndSave(Job{1, 4, false}, kSmall, root + "/reference");
  (void)RunAndSave(Job{1, 4, true}, kSmall, root);
  ExpectPartsCoverOnce(root, 4, kSmall, ref.at_save);
  const std::string padding =
      checkpoint::JoinPath(StepDir(root), checkpoint::PartFileName(v1::ROLE_WORKER, 3));
  const absl::StatusOr<checkpoint::Part> part = checkpoint::ReadPart(padding);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_EQ(*part->MetaInt("slice_begin"), static_cast<int64_t>(kSmall));
  {
    std::fstream f(padding, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  ASSERT_EQ(checkpoint::ReadPart(padding).status().code(), absl::StatusCode::kDataLoss);
  for (const Job& job : {Job{1, 2, true}, Job{1, 2, false}}) {
    (void)RestoreAndCheck(job, kSmall, root, /*reset_errors=*/true, ref.at_save);
  }
  // A worker whose range overlaps a damaged part says which.
  const std::string first =
      checkpoint::JoinPath(StepDir(root), checkpoint::PartFileName(v1::ROLE_WORKER, 0));
  {
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  const absl::Status damaged = RunJob(Job{1, 2, true}, kSmall, [&](int w, Optimizer& o) {
    v1::ResumeFrom resume;
    resume.set_step(kSave);
    resume.set_reset_errors(true);
    return RestoreWorker(root, resume, w, o);
  });
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss) << damaged;
  EXPECT_NE(damaged.message().find("worker-0"), std::string::npos) << damaged;
}

// A checkpoint of local size 2 resumes at local size 4: workers 2 and 3 had no part. The
// optimizer's scalars (1-bit LAMB's, from whole-tensor reductions every worker shares)
// come from another worker's part, the shared tensors over each state range, the errors
// reset.
TEST(CheckpointerShardedTest, AWorkerTheSavedJobDidNotHaveResumesFromTheOthersParts) {
  constexpr size_t kLarge = 1001;
  for (OptimizerKind kind : {OptimizerKind::kOneBitAdam, OptimizerKind::kOneBitLamb}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const std::string root = absl::StrCat(std::getenv("TEST_TMPDIR"), "/grown-",
                                          static_cast<int>(kind));
    const Reference ref = RunAndSave(Job{1, 2, false, kind}, kLarge, root + "/reference");
    (void)RunAndSave(Job{1, 2, true, kind}, kLarge, root);
    for (const Job& job : {Job{1, 4, true, kind}, Job{1, 4, false, kind}}) {
      (void)RestoreAndCheck(job, kLarge, root, /*reset_errors=*/true, ref.at_save);
    }
  }
}

}  // namespace
}  // namespace onebit
