// The ParameterServer service over real gRPC on 127.0.0.1, driven with raw stubs: bad
// pushes end the stream with a clear status and change nothing, duplicates get the result
// again, Pull waits and times out, bytes that are not a proto and oversized messages
// change nothing, and a client that gives up while waiting leaves the shard usable.
#include "server/exchange_service.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/server_process.h"

namespace onebit::server {
namespace {

using ::testing::HasSubstr;
using Stream = grpc::ClientReaderWriter<v1::PushChunk, v1::ChunkResult>;

constexpr int kWorkers = 2;
constexpr size_t kN = 100;  // shard 1 of 2: 50 fp32 values (200 bytes), chunk 56 -> block 11

std::string Floats(int worker, int64_t step, size_t count) {
  std::mt19937 rng(static_cast<uint32_t>(100 * step + worker));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::string bytes(count * 4, '\0');
  for (size_t i = 0; i < count; ++i) {
    const float v = dist(rng);
    std::memcpy(&bytes[4 * i], &v, 4);
  }
  return bytes;
}

std::string Block(int worker, int64_t step, size_t bytes, float scale = 0.5f) {
  std::mt19937 rng(static_cast<uint32_t>(100 * step + worker));
  std::string block(bytes, '\0');
  std::memcpy(&block[0], &scale, 4);
  for (size_t i = 4; i < bytes; ++i) block[i] = static_cast<char>(rng());
  return block;
}

v1::PushChunk Push(int worker, int64_t step, int chunk, v1::ChunkKind kind, std::string payload) {
  v1::PushChunk push;
  push.set_worker(worker);
  push.set_step(step);
  push.set_chunk(chunk);
  push.set_kind(kind);
  push.set_payload(std::move(payload));
  return push;
}

class ExchangeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(absl::Seconds(5), 64); }

  // (Re)starts the shard under test: shard 1 of 2, kWorkers workers, kN parameters.
  void Start(absl::Duration max_pull_wait, int max_waiting_pulls) {
    ServerProcessOptions options;
    options.shard = ShardConfig{1, 2, kWorkers, kN, 2};
    options.serve_metrics = false;
    options.service.max_pull_wait = max_pull_wait;
    options.service.max_waiting_pulls = max_waiting_pulls;
    auto process = ServerProcess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    process_ = std::move(*process);
    channel_ = grpc::CreateChannel(process_->grpc_address(), grpc::InsecureChannelCredentials());
    stub_ = v1::ParameterServer::NewStub(channel_);
    layout_ = &process_->state().layout();
  }

  // Sends one push on a fresh stream and returns how the stream ended.
  grpc::Status PushAlone(const v1::PushChunk& push) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->Exchange(&context);
    stream->Write(push);
    v1::ChunkResult result;
    EXPECT_FALSE(stream->Read(&result)) << "a bad push got a result";
    return stream->Finish();
  }

  // Both workers push `step` on streams of their own; returns worker 0's result.
  v1::ChunkResult CompleteStep(int64_t step, v1::ChunkKind kind) {
    std::vector<v1::ChunkResult> results(kWorkers);
    std::vector<std::thread> threads;
    for (int w = 0; w < kWorkers; ++w) {
      threads.emplace_back([&, w] {
        grpc::ClientContext context;
        auto stream = stub_->Exchange(&context);
        ASSERT_TRUE(stream->Write(Push(w, step, 1, kind, Payload(w, step, kind))));
        ASSERT_TRUE(stream->Read(&results[w]));
        stream->WritesDone();
        EXPECT_TRUE(stream->Finish().ok());
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(results[0].SerializeAsString(), results[1].SerializeAsString());
    return results[0];
  }

  std::string Payload(int w, int64_t step, v1::ChunkKind kind) {
    return kind == v1::CHUNK_KIND_FP32 ? Floats(w, step, layout_->fp32_count(1))
                                       : Block(w, step, layout_->block_bytes());
  }

  std::unique_ptr<ServerProcess> process_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  const PsLayout* layout_ = nullptr;
};

TEST_F(ExchangeServiceTest, BadPushesEndTheStreamAndChangeNothing) {
  ASSERT_EQ(layout_->fp32_count(1), 50u);
  ASSERT_EQ(layout_->block_bytes(), 11u);
  const std::string block = Block(0, 1, 11);
  struct Case {
    v1::PushChunk push;
    grpc::StatusCode code;
    std::string message;
    RejectReason reason;
  };
  const std::vector<Case> cases = {
      {Push(0, 1, 1, v1::CHUNK_KIND_UNSPECIFIED, block), grpc::INVALID_ARGUMENT, "chunk kind",
       RejectReason::kBadKind},
      {Push(0, 1, 1, static_cast<v1::ChunkKind>(9), block), grpc::INVALID_ARGUMENT, "got 9",
       RejectReason::kBadKind},
      {Push(2, 1, 1, v1::CHUNK_KIND_ONEBIT, block), grpc::INVALID_ARGUMENT, "unknown worker 2",
       RejectReason::kUnknownWorker},
      {Push(0, 1, 0, v1::CHUNK_KIND_ONEBIT, block), grpc::INVALID_ARGUMENT,
       "chunk 0 sent to shard 1", RejectReason::kWrongChunk},
      {Push(0, 0, 1, v1::CHUNK_KIND_ONEBIT, block), grpc::INVALID_ARGUMENT, "numbered from 1",
       RejectReason::kBadStep},
      {Push(0, 1, 1, v1::CHUNK_KIND_ONEBIT, block + block), grpc::INVALID_ARGUMENT,
       "must be 11 bytes, got 22", RejectReason::kWrongSize},
      {Push(0, 1, 1, v1::CHUNK_KIND_FP32, Floats(0, 1, 49)), grpc::INVALID_ARGUMENT,
       "must be 200 bytes, got 196", RejectReason::kWrongSize},
      {Push(0, 1, 1, v1::CHUNK_KIND_ONEBIT, Block(0, 1, 11, std::nanf(""))), grpc::INVALID_ARGUMENT,
       "scale", RejectReason::kBadScale},
  };
  for (const Case& c : cases) {
    const grpc::Status status = PushAlone(c.push);
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message));
  }
  for (const Case& c : cases) EXPECT_GE(process_->metrics().rejected(c.reason), 1.0);
  EXPECT_EQ(process_->state().open_step(), 0);
  EXPECT_EQ(process_->state().last_completed_step(), 0);

  // The shard is as new: a whole step runs, and the result is the rank-order sum.
  const v1::ChunkResult result = CompleteStep(1, v1::CHUNK_KIND_FP32);
  EXPECT_EQ(result.step(), 1);
  EXPECT_EQ(result.chunk(), 1);
  EXPECT_EQ(result.kind(), v1::CHUNK_KIND_FP32);
  ASSERT_EQ(result.payload().size(), 200u);
  const std::string a = Floats(0, 1, 50), b = Floats(1, 1, 50);
  for (size_t i = 0; i < 50; ++i) {
    float x, y, got;
    std::memcpy(&x, &a[4 * i], 4);
    std::memcpy(&y, &b[4 * i], 4);
    std::memcpy(&got, &result.payload()[4 * i], 4);
    EXPECT_EQ(got, 0.0f + x + y);
  }
  // Out of order, too: step 3 before step 2, and a kind that is not step 1's.
  EXPECT_EQ(PushAlone(Push(0, 3, 1, v1::CHUNK_KIND_ONEBIT, Block(0, 3, 11))).error_code(),
            grpc::FAILED_PRECONDITION);
  EXPECT_EQ(PushAlone(Push(0, 1, 1, v1::CHUNK_KIND_ONEBIT, Block(0, 1, 11))).error_code(),
            grpc::FAILED_PRECONDITION);
  EXPECT_EQ(process_->state().open_step(), 0);
}

TEST_F(ExchangeServiceTest, ADuplicateOnTheSameStreamGetsTheResultAgain) {
  const v1::ChunkResult first = CompleteStep(1, v1::CHUNK_KIND_ONEBIT);
  const double error_norm = *process_->state().ServerErrorNorm();
  grpc::ClientContext context;
  auto stream = stub_->Exchange(&context);
  v1::ChunkResult again;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(stream->Write(Push(1, 1, 1, v1::CHUNK_KIND_ONEBIT, Block(1, 1, 11))));
    ASSERT_TRUE(stream->Read(&again));
    EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString());
  }
  // A retry with different bytes is refused and ends the stream.
  ASSERT_TRUE(stream->Write(Push(1, 1, 1, v1::CHUNK_KIND_ONEBIT, Block(1, 9, 11))));
  EXPECT_FALSE(stream->Read(&again));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::ALREADY_EXISTS) << status.error_message();
  EXPECT_EQ(*process_->state().ServerErrorNorm(), error_norm);
  EXPECT_EQ(process_->state().last_completed_step(), 1);
}

// A flood of Pulls waiting for a step: past the bound they are refused at once, and the
// workers' pushes still complete the step (and wake the waiting ones).
TEST_F(ExchangeServiceTest, APullFloodDoesNotStarveThePushes) {
  Start(absl::Seconds(20), /*max_waiting_pulls=*/4);

  v1::PullRequest request;
  request.set_worker(0);
  request.set_step(1);
  request.set_chunk(1);
  request.set_kind(v1::CHUNK_KIND_FP32);
  std::vector<std::thread> waiting;
  std::atomic<int> answered{0};
  for (int i = 0; i < 4; ++i) {
    waiting.emplace_back([&] {
      grpc::ClientContext context;
      v1::ChunkResult pulled;
      if (stub_->Pull(&context, request, &pulled).ok()) ++answered;
    });
  }
  absl::SleepFor(absl::Milliseconds(300));  // the four are waiting now
  {
    grpc::ClientContext context;
    v1::ChunkResult pulled;
    const grpc::Status refused = stub_->Pull(&context, request, &pulled);
    EXPECT_EQ(refused.error_code(), grpc::RESOURCE_EXHAUSTED) << refused.error_message();
  }
  CompleteStep(1, v1::CHUNK_KIND_FP32);
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(answered.load(), 4);
}

TEST_F(ExchangeServiceTest, PullReturnsWaitsAndTimesOut) {
  const v1::ChunkResult first = CompleteStep(1, v1::CHUNK_KIND_FP32);
  v1::PullRequest request;
  request.set_worker(0);
  request.set_step(1);
  request.set_chunk(1);
  request.set_kind(v1::CHUNK_KIND_FP32);
  {
    grpc::ClientContext context;
    v1::ChunkResult pulled;
    ASSERT_TRUE(stub_->Pull(&context, request, &pulled).ok());
    EXPECT_EQ(pulled.SerializeAsString(), first.SerializeAsString());
  }
  // Step 2 is open with one push: a pull waits and gets it when the second push comes.
  grpc::ClientContext pusher_context;
  auto pusher = stub_->Exchange(&pusher_context);
  ASSERT_TRUE(pusher->Write(Push(0, 2, 1, v1::CHUNK_KIND_ONEBIT, Block(0, 2, 11))));
  request.set_step(2);
  request.set_kind(v1::CHUNK_KIND_ONEBIT);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::ChunkResult pulled;
    EXPECT_EQ(stub_->Pull(&context, request, &pulled).error_code(), grpc::DEADLINE_EXCEEDED);
  }
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(100));
    grpc::ClientContext context;
    auto stream = stub_->Exchange(&context);
    ASSERT_TRUE(stream->Write(Push(1, 2, 1, v1::CHUNK_KIND_ONEBIT, Block(1, 2, 11))));
    v1::ChunkResult result;
    EXPECT_TRUE(stream->Read(&result));
    stream->WritesDone();
    stream->Finish();
  });
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ChunkResult pulled;
    const grpc::Status status = stub_->Pull(&context, request, &pulled);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(pulled.step(), 2);
    EXPECT_EQ(pulled.payload().size(), 11u);
  }
  late.join();
  v1::ChunkResult pushed;
  ASSERT_TRUE(pusher->Read(&pushed));
  pusher->WritesDone();
  EXPECT_TRUE(pusher->Finish().ok());

  // A pull is checked like a push.
  request.set_worker(5);
  grpc::ClientContext context;
  v1::ChunkResult pulled;
  EXPECT_EQ(stub_->Pull(&context, request, &pulled).error_code(), grpc::INVALID_ARGUMENT);
  request.set_worker(0);
  request.set_step(7);
  grpc::ClientContext context2;
  EXPECT_EQ(stub_->Pull(&context2, request, &pulled).error_code(), grpc::FAILED_PRECONDITION);
}

TEST_F(ExchangeServiceTest, AWorkerThatGivesUpWhileWaitingCanComeBack) {
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto stream = stub_->Exchange(&context);
    ASSERT_TRUE(stream->Write(Push(0, 1, 1, v1::CHUNK_KIND_FP32, Floats(0, 1, 50))));
    v1::ChunkResult result;
    EXPECT_FALSE(stream->Read(&result));
    EXPECT_EQ(stream->Finish().error_code(), grpc::DEADLINE_EXCEEDED);
  }
  EXPECT_EQ(process_->state().open_step(), 1);  // the push stays
  // It pushes again (a duplicate) on a new stream; worker 1 completes the step.
  const v1::ChunkResult result = CompleteStep(1, v1::CHUNK_KIND_FP32);
  EXPECT_EQ(result.payload().size(), 200u);
  EXPECT_EQ(process_->state().last_completed_step(), 1);
}

TEST_F(ExchangeServiceTest, BytesThatAreNotAProtoAndOversizedMessagesAreRefused) {
  grpc::GenericStub generic(channel_);
  grpc::CompletionQueue cq;
  auto next = [&cq] {
    void* tag;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  {
    grpc::ClientContext context;
    auto call = generic.PrepareCall(&context, "/onebit.v1.ParameterServer/Exchange", &cq);
    call->StartCall(reinterpret_cast<void*>(1));
    next();
    const char garbage[] = "\xff\xff\xff\xff\x0f not a PushChunk";
    grpc::Slice slice(garbage, sizeof(garbage));
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    next();
    grpc::ByteBuffer reply;
    call->Read(&reply, reinterpret_cast<void*>(3));
    EXPECT_FALSE(next());
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    next();
    // The service reads the bytes itself (proto/exchange_wire.h): a clear error, nothing
    // pushed.
    EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("malformed PushChunk at byte 0"));
    EXPECT_EQ(process_->state().open_step(), 0);
  }
  {  // A unary Pull with garbage is refused by gRPC itself.
    grpc::ClientContext context;
    const char garbage[] = "\xff\xff\xff\xff\x0f";
    grpc::Slice slice(garbage, sizeof(garbage));
    grpc::ByteBuffer request(&slice, 1), reply;
    grpc::Status status;
    auto call = generic.PrepareUnaryCall(&context, "/onebit.v1.ParameterServer/Pull", request, &cq);
    call->StartCall();
    call->Finish(&reply, &status, reinterpret_cast<void*>(5));
    next();
    EXPECT_FALSE(status.ok());
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  // 1 MiB is far more than the largest legal push (200 bytes here).
  const grpc::Status big = PushAlone(Push(0, 1, 1, v1::CHUNK_KIND_FP32, std::string(1 << 20, 'x')));
  EXPECT_EQ(big.error_code(), grpc::RESOURCE_EXHAUSTED) << big.error_message();
  // Still serving.
  EXPECT_EQ(CompleteStep(1, v1::CHUNK_KIND_FP32).payload().size(), 200u);
}

TEST_F(ExchangeServiceTest, MetricsCountPayloadBytes) {
  CompleteStep(1, v1::CHUNK_KIND_FP32);
  CompleteStep(2, v1::CHUNK_KIND_ONEBIT);
  // Each worker pushed 200 + 11 bytes and got as many back.
  EXPECT_EQ(process_->metrics().bytes_received(), 2 * (200 + 11));
  EXPECT_EQ(process_->metrics().bytes_sent(), 2 * (200 + 11));
}

}  // namespace
}  // namespace onebit::server
