// The worker's checkpoint parts as files: the trainer's scalars (fp16's loss scaler) are
// written with the optimizer's state and read back from any worker's part, so a worker of
// a larger resumed world (without a part of its own) gets them too.
#include "worker/checkpointer.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
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

}  // namespace
}  // namespace onebit
