// ShardState without gRPC: the sums and aggregations against the libraries they must
// equal, every validation error (each one must leave the state exactly as it was: the run
// is finished afterwards and compared bit for bit with a run that never saw the bad push),
// idempotency, step order, waiting, and shutdown.
#include "server/shard_state.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "compression/chunk_aggregator.h"

namespace onebit::server {
namespace {

using ::testing::HasSubstr;

// A valid payload of `kind` for (worker, step): random floats, or a block with a positive
// scale and random signs.
std::string Payload(const PsLayout& layout, int shard, ChunkKind kind, int worker, int64_t step,
                    uint32_t salt = 0) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * step + worker) ^ salt);
  std::string bytes(layout.payload_bytes(kind, shard), '\0');
  if (kind == ChunkKind::kFp32) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (size_t i = 0; i < bytes.size(); i += 4) {
      const float v = dist(rng);
      std::memcpy(&bytes[i], &v, 4);
    }
  } else {
    const float scale = std::uniform_real_distribution<float>(0.01f, 2.0f)(rng);
    std::memcpy(&bytes[0], &scale, 4);
    for (size_t i = 4; i < bytes.size(); ++i) bytes[i] = static_cast<char>(rng());
  }
  return bytes;
}

std::string WithScale(std::string block, float scale) {
  std::memcpy(&block[0], &scale, 4);
  return block;
}

// Counts what the shard reports.
class CountingObserver : public ShardObserver {
 public:
  void OnRejected(RejectReason reason) override { ++rejected[RejectReasonName(reason)]; }
  void OnDuplicate(ChunkKind) override { ++duplicates; }
  void OnStepCompleted(ChunkKind kind, int64_t, absl::Duration) override {
    ++completed[ChunkKindName(kind)];
  }
  void OnServerErrorNorm(double norm) override { last_norm = norm; }

  std::map<std::string, int> rejected, completed;
  int duplicates = 0;
  double last_norm = -1;
};

class ShardStateTest : public ::testing::Test {
 protected:
  std::unique_ptr<ShardState> NewState(const ShardConfig& config,
                                       ShardObserver* observer = nullptr) {
    auto state = ShardState::Create(backend_.get(), config, observer);
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? std::move(*state) : nullptr;
  }

  std::unique_ptr<kernels::Backend> backend_ = kernels::NewCpuBackend();
};

TEST_F(ShardStateTest, CreateValidatesTheConfig) {
  ShardConfig good{1, 2, 3, 100, 2};
  EXPECT_TRUE(ShardState::Create(backend_.get(), good).ok());
  for (ShardConfig bad :
       {ShardConfig{2, 2, 3, 100, 2}, ShardConfig{-1, 2, 3, 100, 2}, ShardConfig{0, 0, 3, 100, 2},
        ShardConfig{0, 2, 0, 100, 2}, ShardConfig{0, 2, 3, 0, 2}, ShardConfig{0, 2, 3, 100, 1}}) {
    EXPECT_EQ(ShardState::Create(backend_.get(), bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(ShardStateTest, Fp32SumsInRankOrderFromZero) {
  const ShardConfig config{1, 2, 3, 11, 2};  // shard 1 of 2: elements [6, 11)
  auto state = NewState(config);
  const PsLayout& layout = state->layout();
  ASSERT_EQ(layout.fp32_count(1), 5u);
  std::vector<std::string> pushes;
  for (int w = 0; w < 3; ++w) pushes.push_back(Payload(layout, 1, ChunkKind::kFp32, w, 1));
  // -0.0 everywhere in element 0: 0.0f + -0.0f + ... is +0.0, which SumRows must give too.
  for (auto& p : pushes) std::memcpy(&p[0], "\x00\x00\x00\x80", 4);

  // Pushed out of rank order; the sum is still in rank order.
  for (int w : {2, 0}) {
    auto outcome = state->Push(w, 1, 1, ChunkKind::kFp32, pushes[w]);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_EQ(outcome->result, nullptr);
  }
  EXPECT_EQ(state->open_step(), 1);
  auto last = state->Push(1, 1, 1, ChunkKind::kFp32, pushes[1]);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_NE(last->result, nullptr);
  EXPECT_EQ(state->open_step(), 0);
  EXPECT_EQ(state->last_completed_step(), 1);

  std::vector<float> want(5);
  for (size_t i = 0; i < 5; ++i) {
    float acc = 0.0f;
    for (int w = 0; w < 3; ++w) {
      float v;
      std::memcpy(&v, &pushes[w][4 * i], 4);
      acc += v;
    }
    want[i] = acc;
  }
  ASSERT_EQ(last->result->size(), 20u);
  EXPECT_EQ(std::memcmp(last->result->data(), want.data(), 20), 0);
  // fp32 steps leave the server error alone.
  EXPECT_EQ(*state->ServerErrorNorm(), 0.0);
}

// The fp32 sum is streamed (each run added once the ranks before it are in, early ones
// kept until then): every arrival order, with payloads handed over as views or as strings
// to keep, gives SumRows' bits; a repeated push of the open step is checked whether its
// run was already added or is still waiting.
TEST_F(ShardStateTest, Fp32StreamedSumMatchesSumRowsInEveryArrivalOrder) {
  constexpr int kW = 4;
  const ShardConfig config{0, 1, kW, 1003, 2};
  const PsLayout layout = *PsLayout::Create(1003, 1);
  std::vector<std::string> runs;
  for (int w = 0; w < kW; ++w) runs.push_back(Payload(layout, 0, ChunkKind::kFp32, w, 1, 7));
  std::string rows;
  for (const std::string& r : runs) rows += r;
  std::vector<float> want(1003);
  ASSERT_TRUE(backend_
                  ->SumRows(reinterpret_cast<const float*>(rows.data()), kW, 1003, want.data())
                  .ok());
  std::vector<int> order = {0, 1, 2, 3};
  int permutations = 0;
  do {
    auto state = NewState(config);
    for (size_t k = 0; k < order.size(); ++k) {
      const int w = order[k];
      absl::StatusOr<ShardState::PushOutcome> outcome =
          (k % 2 == 0) ? state->PushOwned(w, 1, 0, ChunkKind::kFp32, std::string(runs[w]))
                       : state->Push(w, 1, 0, ChunkKind::kFp32, absl::string_view(runs[w]));
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      if (k + 1 < order.size()) {
        ASSERT_EQ(outcome->result, nullptr);
        // Again, the same bytes: a duplicate; other bytes: refused, added or waiting.
        auto same = state->Push(w, 1, 0, ChunkKind::kFp32, runs[w]);
        ASSERT_TRUE(same.ok()) << same.status();
        EXPECT_TRUE(same->duplicate);
        auto other = state->Push(w, 1, 0, ChunkKind::kFp32, runs[(w + 1) % kW]);
        EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
      } else {
        ASSERT_NE(outcome->result, nullptr);
        ASSERT_EQ(outcome->result->size(), want.size() * 4);
        EXPECT_EQ(std::memcmp(outcome->result->data(), want.data(), want.size() * 4), 0)
            << "arrival order " << order[0] << order[1] << order[2] << order[3];
      }
    }
    ++permutations;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(permutations, 24);
}

// `bytes` as a Cord of pieces 1..13 bytes long, so that floats straddle pieces (the gRPC
// service hands the shard the network's receive slices like this).
absl::Cord Fragmented(const std::string& bytes, std::mt19937& rng) {
  absl::Cord cord;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + rng() % 13);
    // External pieces, so that the Cord keeps them apart instead of merging small appends.
    auto* piece = new std::string(bytes.substr(at, n));
    cord.Append(absl::MakeCordFromExternal(*piece, [piece] { delete piece; }));
    at += n;
  }
  return cord;
}

TEST_F(ShardStateTest, FragmentedCordPushesGiveTheSameBitsAsFlatOnes) {
  constexpr int kW = 4;
  std::mt19937 rng(11);
  const ShardConfig config{0, 1, kW, 1003, 2};
  const PsLayout layout = *PsLayout::Create(1003, 1);
  std::vector<std::string> runs, blocks;
  for (int w = 0; w < kW; ++w) {
    runs.push_back(Payload(layout, 0, ChunkKind::kFp32, w, 1, 7));
    blocks.push_back(Payload(layout, 0, ChunkKind::kOnebit, w, 2));
  }
  auto flat = NewState(config);
  ShardState::PushOutcome want_sum, want_avg;
  for (int w = 0; w < kW; ++w) want_sum = *flat->Push(w, 1, 0, ChunkKind::kFp32, runs[w]);
  for (int w = 0; w < kW; ++w) want_avg = *flat->Push(w, 2, 0, ChunkKind::kOnebit, blocks[w]);
  ASSERT_NE(want_sum.result, nullptr);
  ASSERT_NE(want_avg.result, nullptr);
  for (const std::vector<int>& order : std::vector<std::vector<int>>{{3, 1, 0, 2}, {0, 1, 2, 3},
                                                                     {2, 3, 1, 0}}) {
    auto state = NewState(config);
    ShardState::PushOutcome sum, avg;
    for (int w : order) {
      absl::StatusOr<ShardState::PushOutcome> outcome =
          state->PushCord(w, 1, 0, ChunkKind::kFp32, Fragmented(runs[w], rng));
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      sum = *outcome;
      if (sum.result != nullptr) break;
      // The same bytes cut differently: a duplicate; other bytes: refused.
      auto same = state->PushCord(w, 1, 0, ChunkKind::kFp32, Fragmented(runs[w], rng));
      ASSERT_TRUE(same.ok()) << same.status();
      EXPECT_TRUE(same->duplicate);
      EXPECT_EQ(state->PushCord(w, 1, 0, ChunkKind::kFp32, Fragmented(runs[(w + 1) % kW], rng))
                    .status()
                    .code(),
                absl::StatusCode::kAlreadyExists);
    }
    ASSERT_NE(sum.result, nullptr);
    EXPECT_EQ(*sum.result, *want_sum.result);
    // A retry of the finished step, cut differently again, gets the same result.
    auto retry = state->PushCord(order[0], 1, 0, ChunkKind::kFp32, Fragmented(runs[order[0]], rng));
    ASSERT_TRUE(retry.ok()) << retry.status();
    EXPECT_TRUE(retry->duplicate);
    for (int w : order) {
      auto outcome = state->PushCord(w, 2, 0, ChunkKind::kOnebit, Fragmented(blocks[w], rng));
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      avg = *outcome;
      if (avg.result == nullptr) {
        EXPECT_TRUE(
            state->PushCord(w, 2, 0, ChunkKind::kOnebit, Fragmented(blocks[w], rng))->duplicate);
      }
    }
    ASSERT_NE(avg.result, nullptr);
    EXPECT_EQ(*avg.result, *want_avg.result);
  }
}

// A dropped result's memory becomes a later step's sum, but only once nobody holds it: a
// result a caller (a reply being sent) still holds never changes.
TEST_F(ShardStateTest, ReusedSumMemoryNeverChangesAHeldResult) {
  constexpr int kW = 3;
  const ShardConfig config{0, 1, kW, 257, 2};
  const PsLayout layout = *PsLayout::Create(257, 1);
  auto state = NewState(config);
  std::vector<ResultPayload> held;
  std::vector<std::string> copies;
  for (int64_t step = 1; step <= 8; ++step) {
    std::string rows;
    ResultPayload result;
    for (int w = 0; w < kW; ++w) {
      const std::string run = Payload(layout, 0, ChunkKind::kFp32, w, step);
      rows += run;
      auto outcome = state->Push(w, step, 0, ChunkKind::kFp32, run);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      result = outcome->result;
    }
    std::vector<float> want(257);
    ASSERT_TRUE(
        backend_->SumRows(reinterpret_cast<const float*>(rows.data()), kW, 257, want.data()).ok());
    ASSERT_NE(result, nullptr);
    ASSERT_EQ(std::memcmp(result->data(), want.data(), want.size() * 4), 0) << "step " << step;
    if (step % 3 == 1) {  // held on to, like a reply still in flight
      held.push_back(result);
      copies.push_back(*result);
    }
  }
  for (size_t i = 0; i < held.size(); ++i) EXPECT_EQ(*held[i], copies[i]);
}

// An int8 block: Payload's scale and random codes, with a finite offset.
std::string Int8Payload(const PsLayout& layout, int worker, int64_t step) {
  std::string block = Payload(layout, 0, ChunkKind::kOnebit, worker, step);
  const float offset = -0.5f * static_cast<float>(worker + 1);
  std::memcpy(&block[4], &offset, 4);
  return block;
}

TEST_F(ShardStateTest, Int8MatchesChunkAggregatorInRankOrder) {
  ShardConfig config{0, 3, 4, 1000, 2};
  config.codec = &Int8Codec();
  auto state = NewState(config);
  const PsLayout& layout = state->layout();
  ASSERT_EQ(layout.block_bytes(), 8 + layout.chunk());
  auto direct = ChunkAggregator::Create(backend_.get(), layout.chunk(), Int8Codec());
  ASSERT_TRUE(direct.ok());
  for (int64_t step = 1; step <= 3; ++step) {
    std::string rows;
    for (int w = 0; w < 4; ++w) rows += Int8Payload(layout, w, step);
    std::string want(layout.block_bytes(), '\0');
    ASSERT_TRUE((*direct)
                    ->Aggregate(reinterpret_cast<const uint8_t*>(rows.data()), 4,
                                reinterpret_cast<uint8_t*>(want.data()))
                    .ok());
    ResultPayload got;
    for (int w : {2, 0, 3, 1}) {
      auto outcome = state->Push(w, step, 0, ChunkKind::kOnebit,
                                 rows.substr(w * layout.block_bytes(), layout.block_bytes()));
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      got = outcome->result;
    }
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(*got, want) << "step " << step;
    EXPECT_EQ(*state->ServerErrorToHost(), *(*direct)->error().ToHost());
  }
}

// A worker and a shard that disagree about exchange.compressor: rejected with a message
// that names the mismatch, both ways round; non-finite int8 headers rejected.
TEST_F(ShardStateTest, CompressorMismatchAndBadInt8HeadersAreRejected) {
  CountingObserver observer;
  ShardConfig config{0, 2, 2, 1000, 2};
  auto onebit = NewState(config, &observer);
  config.codec = &Int8Codec();
  auto int8 = NewState(config, &observer);
  const size_t chunk = onebit->layout().chunk();
  auto pushed = onebit->Push(0, 1, 0, ChunkKind::kOnebit,
                             std::string(kernels::Int8BlockBytes(chunk), '\0'));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(pushed.status().message()),
              HasSubstr("the block size of compressor int8, but this shard's job compresses "
                        "with onebit (onebit.exchange.compressor"));
  pushed = int8->Push(0, 1, 0, ChunkKind::kOnebit,
                      std::string(kernels::CompressedBlockBytes(chunk), '\0'));
  EXPECT_THAT(std::string(pushed.status().message()),
              HasSubstr("the block size of compressor onebit, but this shard's job compresses "
                        "with int8"));
  // Some other size: no guess.
  pushed = int8->Push(0, 1, 0, ChunkKind::kOnebit, std::string(17, '\0'));
  EXPECT_THAT(std::string(pushed.status().message()), HasSubstr("(int8 blocks of"));
  EXPECT_THAT(std::string(pushed.status().message()), testing::Not(HasSubstr("compressor onebit")));
  EXPECT_EQ(observer.rejected["wrong_size"], 3);
  for (float bad : {std::nanf(""), INFINITY}) {
    std::string block = Int8Payload(int8->layout(), 0, 1);
    std::memcpy(&block[4], &bad, 4);
    pushed = int8->Push(0, 1, 0, ChunkKind::kOnebit, block);
    EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(pushed.status().message()), HasSubstr("int8 block offset must be finite"));
    pushed = int8->Push(0, 1, 0, ChunkKind::kOnebit, WithScale(Int8Payload(int8->layout(), 0, 1), bad));
    EXPECT_THAT(std::string(pushed.status().message()), HasSubstr("int8 block scale must be finite"));
  }
  EXPECT_EQ(observer.rejected["bad_scale"], 4);
  EXPECT_EQ(int8->open_step(), 0);
}

TEST_F(ShardStateTest, OnebitMatchesChunkAggregatorInRankOrder) {
  const ShardConfig config{0, 3, 4, 1000, 2};
  auto state = NewState(config);
  const PsLayout& layout = state->layout();
  auto direct = ChunkAggregator::Create(backend_.get(), layout.chunk());
  ASSERT_TRUE(direct.ok());
  for (int64_t step = 1; step <= 3; ++step) {
    std::string rows;
    for (int w = 0; w < 4; ++w) rows += Payload(layout, 0, ChunkKind::kOnebit, w, step);
    std::string want(layout.block_bytes(), '\0');
    ASSERT_TRUE((*direct)
                    ->Aggregate(reinterpret_cast<const uint8_t*>(rows.data()), 4,
                                reinterpret_cast<uint8_t*>(want.data()))
                    .ok());
    ResultPayload got;
    for (int w : {3, 1, 0, 2}) {
      auto outcome = state->Push(w, step, 0, ChunkKind::kOnebit,
                                 rows.substr(w * layout.block_bytes(), layout.block_bytes()));
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      got = outcome->result;
    }
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(*got, want) << "step " << step;
    EXPECT_EQ(*state->ServerErrorToHost(), *(*direct)->error().ToHost());
  }
}

// The scenario of the validation tests: W = 3 workers, shard 1 of 2, n = 37; steps 1 and 2
// fp32, 3..5 onebit; before worker 1 pushes step 4 (worker 0 already did), `inject` runs.
// Returns every result in order and the final server error.
struct RunOutput {
  std::vector<std::string> results;
  std::vector<float> server_error;
};
constexpr int kWorkers = 3;
constexpr int64_t kSteps = 5;
ChunkKind KindOfStep(int64_t step) { return step <= 2 ? ChunkKind::kFp32 : ChunkKind::kOnebit; }

RunOutput RunScenario(ShardState& state, const std::function<void(ShardState&)>& inject) {
  RunOutput out;
  const PsLayout& layout = state.layout();
  for (int64_t step = 1; step <= kSteps; ++step) {
    const ChunkKind kind = KindOfStep(step);
    ResultPayload result;
    for (int w = 0; w < kWorkers; ++w) {
      if (step == 4 && w == 1 && inject) inject(state);
      auto outcome = state.Push(w, step, 1, kind, Payload(layout, 1, kind, w, step));
      EXPECT_TRUE(outcome.ok()) << outcome.status();
      if (outcome.ok()) result = outcome->result;
    }
    EXPECT_NE(result, nullptr);
    out.results.push_back(result ? *result : "");
  }
  out.server_error = *state.ServerErrorToHost();
  return out;
}

struct BadPush {
  std::string name;
  int worker;
  int64_t step;
  int chunk;
  int kind;
  std::string payload;
  absl::StatusCode code;
  std::string message;  // a substring of the status message
  std::string reason;   // the rejection counter's label
};

TEST_F(ShardStateTest, EveryRejectedPushLeavesTheStateUnchanged) {
  const ShardConfig config{1, 2, kWorkers, 37, 2};
  auto reference_state = NewState(config);
  const RunOutput reference = RunScenario(*reference_state, nullptr);
  const PsLayout& layout = reference_state->layout();
  const size_t fp32_bytes = layout.payload_bytes(ChunkKind::kFp32, 1);
  ASSERT_EQ(fp32_bytes, 72u);           // 18 of the 37 values
  ASSERT_EQ(layout.block_bytes(), 7u);  // 37 -> 48 padded, chunk 24
  const std::string block_w1 = Payload(layout, 1, ChunkKind::kOnebit, 1, 4);
  const std::string fp32_w1 = Payload(layout, 1, ChunkKind::kFp32, 1, 4);
  const int fp32 = static_cast<int>(ChunkKind::kFp32);
  const int onebit = static_cast<int>(ChunkKind::kOnebit);
  using C = absl::StatusCode;

  const std::vector<BadPush> cases = {
      {"unspecified kind", 1, 4, 1, 0, block_w1, C::kInvalidArgument, "chunk kind", "bad_kind"},
      {"unknown kind", 1, 4, 1, 7, block_w1, C::kInvalidArgument, "got 7", "bad_kind"},
      {"negative worker", -1, 4, 1, onebit, block_w1, C::kInvalidArgument, "unknown worker -1",
       "unknown_worker"},
      {"worker W", kWorkers, 4, 1, onebit, block_w1, C::kInvalidArgument, "unknown worker 3",
       "unknown_worker"},
      {"other shard's chunk", 1, 4, 0, onebit, block_w1, C::kInvalidArgument,
       "chunk 0 sent to shard 1", "wrong_chunk"},
      {"step 0", 1, 0, 1, onebit, block_w1, C::kInvalidArgument, "numbered from 1", "bad_step"},
      {"negative step", 1, -4, 1, onebit, block_w1, C::kInvalidArgument, "got -4", "bad_step"},
      {"short block", 1, 4, 1, onebit, block_w1.substr(1), C::kInvalidArgument,
       "must be 7 bytes, got 6", "wrong_size"},
      {"long block", 1, 4, 1, onebit, block_w1 + "x", C::kInvalidArgument, "must be 7 bytes, got 8",
       "wrong_size"},
      {"empty block", 1, 4, 1, onebit, std::string(), C::kInvalidArgument, "must be 7 bytes, got 0",
       "wrong_size"},
      {"short fp32", 1, 4, 1, fp32, fp32_w1.substr(4), C::kInvalidArgument,
       "must be 72 bytes, got 68", "wrong_size"},
      {"NaN scale", 1, 4, 1, onebit, WithScale(block_w1, std::nanf("")), C::kInvalidArgument,
       "scale", "bad_scale"},
      {"infinite scale", 1, 4, 1, onebit, WithScale(block_w1, INFINITY), C::kInvalidArgument,
       "scale", "bad_scale"},
      {"negative scale", 1, 4, 1, onebit, WithScale(block_w1, -1.0f), C::kInvalidArgument, "scale",
       "bad_scale"},
      {"step before the window", 1, 1, 1, fp32, fp32_w1, C::kFailedPrecondition,
       "older than the steps this shard keeps (2..3; step 4 is open)", "stale_step"},
      {"step ahead of the open one", 1, 5, 1, onebit, block_w1, C::kFailedPrecondition,
       "while step 4 is open", "step_ahead"},
      {"fp32 push to the onebit step", 1, 4, 1, fp32, fp32_w1, C::kFailedPrecondition,
       "step 4 is onebit, got fp32", "kind_mismatch"},
      {"onebit push to a finished fp32 step", 1, 2, 1, onebit, block_w1, C::kFailedPrecondition,
       "step 2 is fp32, got onebit", "kind_mismatch"},
      {"different payload for the open step", 0, 4, 1, onebit, block_w1, C::kAlreadyExists,
       "worker 0 already pushed a different payload for step 4", "conflicting_duplicate"},
      {"different payload for a finished step", 2, 3, 1, onebit, block_w1, C::kAlreadyExists,
       "worker 2 already pushed a different payload for step 3", "conflicting_duplicate"},
  };
  for (const BadPush& c : cases) {
    SCOPED_TRACE(c.name);
    CountingObserver observer;
    auto state = NewState(config, &observer);
    const RunOutput got = RunScenario(*state, [&](ShardState& s) {
      const std::vector<float> error_before = *s.ServerErrorToHost();
      auto outcome = s.Push(c.worker, c.step, c.chunk, static_cast<ChunkKind>(c.kind), c.payload);
      ASSERT_FALSE(outcome.ok());
      EXPECT_EQ(outcome.status().code(), c.code) << outcome.status();
      EXPECT_THAT(std::string(outcome.status().message()), HasSubstr(c.message));
      EXPECT_EQ(s.open_step(), 4);
      EXPECT_EQ(*s.ServerErrorToHost(), error_before);
    });
    EXPECT_EQ(got.results, reference.results);
    EXPECT_EQ(got.server_error, reference.server_error);
    EXPECT_EQ(observer.rejected, (std::map<std::string, int>{{c.reason, 1}}));
    EXPECT_EQ(observer.completed, (std::map<std::string, int>{{"fp32", 2}, {"onebit", 3}}));
  }
}

TEST_F(ShardStateTest, DuplicatesChangeNothingAndGetTheResultAgain) {
  const ShardConfig config{1, 2, kWorkers, 37, 2};
  auto reference_state = NewState(config);
  const RunOutput reference = RunScenario(*reference_state, nullptr);

  CountingObserver observer;
  auto state = NewState(config, &observer);
  const PsLayout& layout = state->layout();
  const RunOutput got = RunScenario(*state, [&](ShardState& s) {
    // Worker 0 again for the open step 4: accepted, nothing changes, still open.
    auto again = s.Push(0, 4, 1, ChunkKind::kOnebit, Payload(layout, 1, ChunkKind::kOnebit, 0, 4));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_TRUE(again->duplicate);
    EXPECT_EQ(again->result, nullptr);
    EXPECT_EQ(s.open_step(), 4);
    // Retries of the finished steps 2 and 3 get their results again.
    for (int64_t step : {2, 3}) {
      const ChunkKind kind = KindOfStep(step);
      auto retry = s.Push(2, step, 1, kind, Payload(layout, 1, kind, 2, step));
      ASSERT_TRUE(retry.ok()) << retry.status();
      EXPECT_TRUE(retry->duplicate);
      ASSERT_NE(retry->result, nullptr);
      EXPECT_EQ(*retry->result, reference.results[step - 1]);
    }
  });
  EXPECT_EQ(got.results, reference.results);
  EXPECT_EQ(got.server_error, reference.server_error);
  EXPECT_EQ(observer.duplicates, 3);
  EXPECT_TRUE(observer.rejected.empty());
  EXPECT_GT(observer.last_norm, 0.0);
  EXPECT_DOUBLE_EQ(observer.last_norm, *state->ServerErrorNorm());
}

// 0/1 Adam: steps skip the local ones, but never go back.
TEST_F(ShardStateTest, StepGapsWhenAllowed) {
  ShardConfig config{0, 1, 2, 16, 2};
  config.allow_step_gaps = true;
  auto state = NewState(config);
  const PsLayout& layout = state->layout();
  auto push = [&](int w, int64_t step) {
    return state->Push(w, step, 0, ChunkKind::kFp32, Payload(layout, 0, ChunkKind::kFp32, w, step));
  };
  ASSERT_TRUE(push(0, 3).ok());
  ASSERT_TRUE(push(1, 3).ok());
  ASSERT_TRUE(push(0, 7).ok());  // 4..6 were local steps
  EXPECT_EQ(push(1, 8).status().code(), absl::StatusCode::kFailedPrecondition);  // 7 is open
  ASSERT_TRUE(push(1, 7).ok());
  EXPECT_EQ(state->last_completed_step(), 7);
  EXPECT_EQ(push(0, 5).status().code(), absl::StatusCode::kFailedPrecondition);  // stale
  ASSERT_TRUE(push(0, 20).ok());
}

TEST_F(ShardStateTest, StepsComeInOrder) {
  auto state = NewState(ShardConfig{0, 1, 2, 16, 2});
  const PsLayout& layout = state->layout();
  auto push = [&](int w, int64_t step) {
    return state->Push(w, step, 0, ChunkKind::kFp32, Payload(layout, 0, ChunkKind::kFp32, w, step));
  };
  // A fresh shard opens at the first step it sees (a resumed job).
  ASSERT_TRUE(push(0, 10).ok());
  EXPECT_EQ(push(1, 9).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(push(1, 11).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(push(1, 10).ok());
  EXPECT_EQ(state->last_completed_step(), 10);
  // Nothing open: only the next step may open.
  auto skip = push(0, 12);
  EXPECT_EQ(skip.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(skip.status().message()), HasSubstr("skips ahead"));
  EXPECT_EQ(push(0, 9).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(push(0, 11).ok());
  ASSERT_TRUE(push(1, 11).ok());
  ASSERT_TRUE(push(0, 12).ok());
  ASSERT_TRUE(push(1, 12).ok());
  // Steps 11 and 12 are kept, 10 is gone.
  EXPECT_TRUE(push(1, 11).ok());
  EXPECT_EQ(push(1, 10).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A shard of a job opens only at the job's first step: a stray client cannot pin it to
// a far-future step. Closed until told, pushes wait.
TEST_F(ShardStateTest, AStrayFarFuturePushCannotPinTheShard) {
  ShardConfig config{0, 1, 2, 16, 2};
  config.first_step = -1;
  auto state = NewState(config);
  const PsLayout& layout = state->layout();
  auto push = [&](int w, int64_t step) {
    return state->Push(w, step, 0, ChunkKind::kFp32, Payload(layout, 0, ChunkKind::kFp32, w, step));
  };
  std::thread early([&] { EXPECT_TRUE(push(0, 11).ok()); });  // waits until opened
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(state->open_step(), 0);
  ASSERT_TRUE(state->SetFirstStep(11).ok());  // resumed after step 10
  early.join();
  EXPECT_EQ(state->open_step(), 11);
  ASSERT_TRUE(push(1, 11).ok());
  EXPECT_EQ(state->SetFirstStep(1).code(), absl::StatusCode::kFailedPrecondition);

  ShardConfig fresh{0, 1, 2, 16, 2};
  fresh.first_step = 1;
  auto other = NewState(fresh);
  auto stray = other->Push(0, 1000000000, 0, ChunkKind::kFp32,
                           Payload(layout, 0, ChunkKind::kFp32, 0, 1000000000));
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stray.status().message()), HasSubstr("starts at step 1"));
  EXPECT_EQ(other->open_step(), 0);
  EXPECT_TRUE(other->Push(0, 1, 0, ChunkKind::kFp32, Payload(layout, 0, ChunkKind::kFp32, 0, 1)).ok());
}

TEST_F(ShardStateTest, WorkersOnThreadsAgreeWithASequentialRun) {
  const ShardConfig config{2, 3, 4, 5000, 3};
  auto sequential = NewState(config);
  auto threaded = NewState(config);
  const PsLayout& layout = sequential->layout();
  constexpr int64_t kThreadSteps = 20;
  auto kind_of = [](int64_t step) { return step <= 8 ? ChunkKind::kFp32 : ChunkKind::kOnebit; };

  std::vector<std::string> want;
  for (int64_t step = 1; step <= kThreadSteps; ++step) {
    ResultPayload r;
    for (int w = 0; w < 4; ++w) {
      r = sequential->Push(w, step, 2, kind_of(step), Payload(layout, 2, kind_of(step), w, step))
              ->result;
    }
    want.push_back(*r);
  }

  std::vector<std::vector<std::string>> got(4);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int64_t step = 1; step <= kThreadSteps; ++step) {
        const ChunkKind kind = kind_of(step);
        auto outcome = threaded->Push(w, step, 2, kind, Payload(layout, 2, kind, w, step));
        ASSERT_TRUE(outcome.ok()) << outcome.status();
        auto result = threaded->AwaitResult(w, step, 2, kind, absl::Now() + absl::Seconds(30));
        ASSERT_TRUE(result.ok()) << result.status();
        got[w].push_back(**result);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(got[w], want) << "worker " << w;
  EXPECT_EQ(*threaded->ServerErrorToHost(), *sequential->ServerErrorToHost());
}

TEST_F(ShardStateTest, AwaitTimesOutIsCancelledAndWakesOnShutdown) {
  auto state = NewState(ShardConfig{0, 1, 2, 16, 2});
  const PsLayout& layout = state->layout();
  ASSERT_TRUE(
      state->Push(0, 1, 0, ChunkKind::kFp32, Payload(layout, 0, ChunkKind::kFp32, 0, 1)).ok());

  auto timed_out =
      state->AwaitResult(0, 1, 0, ChunkKind::kFp32, absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  auto cancelled =
      state->AwaitResult(0, 1, 0, ChunkKind::kFp32, absl::InfiniteFuture(), [] { return true; });
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled);
  // Await checks the request like a push, and the step's kind.
  EXPECT_EQ(state->AwaitResult(5, 1, 0, ChunkKind::kFp32, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state->AwaitResult(0, 1, 0, ChunkKind::kOnebit, absl::Now()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(state->AwaitResult(0, 3, 0, ChunkKind::kFp32, absl::Now()).status().code(),
            absl::StatusCode::kFailedPrecondition);

  absl::Status waiter_status;
  std::thread waiter([&] {
    waiter_status = state->AwaitResult(0, 1, 0, ChunkKind::kFp32, absl::InfiniteFuture()).status();
  });
  absl::SleepFor(absl::Milliseconds(50));
  state->Shutdown();
  waiter.join();
  EXPECT_EQ(waiter_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(state->Push(1, 1, 0, ChunkKind::kFp32, Payload(layout, 0, ChunkKind::kFp32, 1, 1))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ShardStateTest, EmptyRunsStillTakePart) {
  // 3 values over 5 shards: shards 3 and 4 own no fp32 values but the step completes.
  auto state = NewState(ShardConfig{4, 5, 2, 3, 2});
  EXPECT_EQ(state->layout().payload_bytes(ChunkKind::kFp32, 4), 0u);
  ASSERT_TRUE(state->Push(0, 1, 4, ChunkKind::kFp32, "").ok());
  auto last = state->Push(1, 1, 4, ChunkKind::kFp32, "");
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_NE(last->result, nullptr);
  EXPECT_TRUE(last->result->empty());
}

}  // namespace
}  // namespace onebit::server
