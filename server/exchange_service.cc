#include "server/exchange_service.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "proto/exchange_wire.h"
#include "proto/grpc_status.h"

namespace onebit::server {
namespace {

void FillHeader(int64_t step, int chunk, ChunkKind kind, v1::ChunkResult* out) {
  out->set_step(step);
  out->set_chunk(chunk);
  out->set_kind(static_cast<v1::ChunkKind>(kind));
}

// The call's deadline, and at most `max_wait` from now.
absl::Time CallDeadline(const grpc::ServerContext& context, absl::Duration max_wait) {
  absl::Time deadline = absl::Now() + max_wait;
  if (context.deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(context.deadline()));
  }
  return deadline;
}

}  // namespace

ExchangeService::ExchangeService(ShardState* state, ServerMetrics* metrics,
                                 const ExchangeServiceOptions& options)
    : state_(state),
      metrics_(metrics),
      options_(options),
      overflow_votes_(state->config().num_workers) {
  // Method 0 is Exchange (exchange.proto's order): the same method, read and written as
  // ByteBuffers instead of protobuf messages.
  MarkMethodStreamed(
      0, new grpc::internal::BidiStreamingHandler<ExchangeService, grpc::ByteBuffer,
                                                  grpc::ByteBuffer>(
             [](ExchangeService* service, grpc::ServerContext* context,
                grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
               return service->ExchangeRaw(context, stream);
             },
             this));
}

grpc::Status ExchangeService::ExchangeRaw(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  auto cancelled = [context] { return context->IsCancelled(); };
  grpc::ByteBuffer message;
  while (stream->Read(&message)) {
    absl::StatusOr<wire::PushFields> push = wire::ParsePush(wire::ToCord(message));
    message.Clear();  // the payload's slices live on in push->payload only
    if (!push.ok()) return ToGrpcStatus(push.status());
    const size_t payload_bytes = push->payload.size();
    if (metrics_ != nullptr) metrics_->AddBytesReceived(payload_bytes);
    // Any int converts; ShardState rejects what is not a known kind.
    const auto kind = static_cast<ChunkKind>(push->kind);
    absl::StatusOr<ShardState::PushOutcome> outcome =
        state_->PushCord(push->worker, push->step, push->chunk, kind, std::move(push->payload),
                         push->checkpoint, push->reset_errors);
    if (!outcome.ok()) return ToGrpcStatus(outcome.status());
    ResultPayload result = outcome->result;
    if (result == nullptr) {
      absl::StatusOr<ResultPayload> awaited = state_->AwaitResult(
          push->worker, push->step, push->chunk, kind, absl::InfiniteFuture(), cancelled);
      if (!awaited.ok()) return ToGrpcStatus(awaited.status());
      result = *std::move(awaited);
    }
    const size_t result_bytes = result->size();
    if (!stream->Write(wire::EncodeResult(push->step, push->chunk, static_cast<int32_t>(kind),
                                          wire::SharedSlice(std::move(result))))) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the worker's stream went away");
    }
    if (metrics_ != nullptr) metrics_->AddBytesSent(result_bytes);
  }
  return grpc::Status::OK;
}

grpc::Status ExchangeService::Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                                   v1::ChunkResult* response) {
  if (waiting_pulls_.fetch_add(1) >= options_.max_waiting_pulls) {
    waiting_pulls_.fetch_sub(1);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("more than ", options_.max_waiting_pulls,
                                     " Pulls are waiting on this shard; try again later"));
  }
  struct Release {
    std::atomic<int>& count;
    ~Release() { count.fetch_sub(1); }
  } release{waiting_pulls_};
  const absl::Time deadline = CallDeadline(*context, options_.max_pull_wait);
  const auto kind = static_cast<ChunkKind>(static_cast<int>(request->kind()));
  absl::StatusOr<ResultPayload> result =
      state_->AwaitResult(request->worker(), request->step(), request->chunk(), kind, deadline,
                          [context] { return context->IsCancelled(); });
  if (!result.ok()) return ToGrpcStatus(result.status());
  FillHeader(request->step(), request->chunk(), kind, response);
  response->set_payload(**result);
  if (metrics_ != nullptr) metrics_->AddBytesSent((*result)->size());
  return grpc::Status::OK;
}

grpc::Status ExchangeService::AgreeOverflow(grpc::ServerContext* context,
                                            const v1::OverflowVote* request,
                                            v1::OverflowAgreement* response) {
  const absl::Time deadline = CallDeadline(*context, options_.max_pull_wait);
  absl::StatusOr<bool> any =
      overflow_votes_.Vote(request->worker(), request->step(), request->overflow(), deadline,
                           [context] { return context->IsCancelled(); });
  if (!any.ok()) return ToGrpcStatus(any.status());
  response->set_step(request->step());
  response->set_any_overflow(*any);
  return grpc::Status::OK;
}

}  // namespace onebit::server
