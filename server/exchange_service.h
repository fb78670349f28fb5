// onebit.v1.ParameterServer over a ShardState: the gRPC face of one shard.
//
// Exchange: one bidi stream per worker. Each PushChunk is handed to ShardState::Push; the
// ChunkResult of that step is written back on the same stream once all W workers have
// pushed (at once for a retry of a finished step). A rejected push ends the stream with
// ShardState's status (INVALID_ARGUMENT, FAILED_PRECONDITION or ALREADY_EXISTS) and has
// changed nothing. A stream whose client goes away stops waiting within ~50 ms. Bytes
// that do not parse as a PushChunk end the stream with INVALID_ARGUMENT (naming the byte)
// and push nothing; a message larger than the largest legal push is refused by gRPC
// (RESOURCE_EXHAUSTED) before it is buffered.
//
// Threads: gRPC's synchronous API, so every open stream holds a server thread while it
// waits for the slowest worker. The W streams wait on each other in ShardState and cannot
// deadlock while the server may run W + a few threads at once (ServerProcess's thread
// quota is a generous multiple of W); with W in the tens to hundreds per shard, threads
// are simpler than completion callbacks.
//
// Thread safety: thread-safe. State and metrics are borrowed; metrics may be null.
#ifndef ONEBIT_SERVER_EXCHANGE_SERVICE_H_
#define ONEBIT_SERVER_EXCHANGE_SERVICE_H_

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "onebit/v1/exchange.grpc.pb.h"
#include "server/overflow_votes.h"
#include "server/server_metrics.h"
#include "server/shard_state.h"

namespace onebit::server {

struct ExchangeServiceOptions {
  absl::Duration max_pull_wait = absl::Seconds(60);
  // Pulls waiting at once; more get RESOURCE_EXHAUSTED at once, so that a flood of Pulls
  // (each holding a server thread while it waits) cannot starve the workers' streams.
  int max_waiting_pulls = 64;
};

class ExchangeService final : public v1::ParameterServer::Service {
 public:
  ExchangeService(ShardState* state, ServerMetrics* metrics,
                  const ExchangeServiceOptions& options = {});

  // Exchange over raw messages (registered in place of the generated protobuf handler;
  // proto/exchange_wire.h, the same bytes as exchange.proto). No payload is copied: a
  // push's payload reaches ShardState as a Cord over gRPC's receive slices, and every
  // reply's payload references the step's one result string, shared by all W streams.
  grpc::Status ExchangeRaw(grpc::ServerContext* context,
                           grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  // The result of a recent step (plain protobuf, off the hot path); waits while it is
  // open, up to the call's deadline and at most `max_pull_wait`.
  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                    v1::ChunkResult* response) override;
  // Over OverflowVotes for the shard's W workers; waits up to the call's deadline and at
  // most `max_pull_wait`.
  grpc::Status AgreeOverflow(grpc::ServerContext* context, const v1::OverflowVote* request,
                             v1::OverflowAgreement* response) override;

 private:
  ShardState* const state_;
  ServerMetrics* const metrics_;
  const ExchangeServiceOptions options_;
  std::atomic<int> waiting_pulls_{0};
  OverflowVotes overflow_votes_;
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_EXCHANGE_SERVICE_H_
