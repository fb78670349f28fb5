#include "server/exchange_service.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "proto/grpc_status.h"

namespace onebit::server {
namespace {

void FillHeader(int64_t step, int chunk, ChunkKind kind, v1::ChunkResult* out) {
  out->set_step(step);
  out->set_chunk(chunk);
  out->set_kind(static_cast<v1::ChunkKind>(kind));
}

}  // namespace

grpc::Status ExchangeService::Exchange(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ChunkResult, v1::PushChunk>* stream) {
  auto cancelled = [context] { return context->IsCancelled(); };
  v1::PushChunk push;
  v1::ChunkResult reply;
  while (stream->Read(&push)) {
    if (metrics_ != nullptr) metrics_->AddBytesReceived(push.payload().size());
    // Any int converts; ShardState rejects what is not a known kind.
    const auto kind = static_cast<ChunkKind>(static_cast<int>(push.kind()));
    // The payload's bytes move into the shard (kept there only while an fp32 run waits for
    // its turn in the rank-order sum); the next Read parses into a fresh string.
    absl::StatusOr<ShardState::PushOutcome> outcome =
        state_->PushOwned(push.worker(), push.step(), push.chunk(), kind,
                          std::move(*push.mutable_payload()), push.checkpoint());
    push.mutable_payload()->clear();
    if (!outcome.ok()) return ToGrpcStatus(outcome.status());
    ResultPayload result = outcome->result;
    if (result == nullptr) {
      absl::StatusOr<ResultPayload> awaited = state_->AwaitResult(
          push.worker(), push.step(), push.chunk(), kind, absl::InfiniteFuture(), cancelled);
      if (!awaited.ok()) return ToGrpcStatus(awaited.status());
      result = *std::move(awaited);
    }
    FillHeader(push.step(), push.chunk(), kind, &reply);
    reply.set_payload(*result);
    if (!stream->Write(reply)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the worker's stream went away");
    }
    if (metrics_ != nullptr) metrics_->AddBytesSent(result->size());
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
  absl::Time deadline = absl::Now() + options_.max_pull_wait;
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = std::min(deadline, absl::FromChrono(context->deadline()));
  }
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

}  // namespace onebit::server
