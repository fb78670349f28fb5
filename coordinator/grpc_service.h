// The gRPC face of the coordinator: each method converts nothing but the status and calls
// the CoordinatorHandler. The Session stream is built from Heartbeat and WaitForJobChange:
// a reader thread feeds heartbeats to the handler while the handler's thread pushes a
// JobEvent after the first heartbeat and after every change of the job.
//
// One watcher thread (started with the first session) waits for the job's changes and
// hands every open session the same event, built once; sessions sleep on their own mutex
// until it comes. (Each session waiting on the handler itself cost O(sessions) per call:
// at 1,024 members the coordinator's CPU went to waking them.)
//
// Every method first checks the caller's bearer token (security/auth.h): Freeze,
// DelayFreeze, Stop and Checkpoint are admin calls; the rest (the members' calls and the
// reads) are member calls. A refused call never reaches the handler.
//
// At most max_sessions Session streams are open at once; another one is answered
// RESOURCE_EXHAUSTED at once, so a flood of sessions cannot hold every server thread
// (coordinator_server bounds the threads; this keeps room in them for the other calls).
//
// Thread-safe (gRPC calls methods from its own threads). The handler and the metrics are
// not owned and must outlive the service; metrics may be null.
#ifndef ONEBIT_COORDINATOR_GRPC_SERVICE_H_
#define ONEBIT_COORDINATOR_GRPC_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/coordinator_handler.h"
#include "coordinator/metrics.h"
#include "grpcpp/grpcpp.h"
#include "onebit/v1/coordinator.grpc.pb.h"
#include "security/auth.h"

namespace onebit {

struct CoordinatorGrpcServiceOptions {
  security::Tokens tokens;  // none: every call is open (to whom the transport admits)
  int max_sessions = 0;     // open Session streams at once; 0: no bound
};

class CoordinatorGrpcService final : public v1::Coordinator::Service {
 public:
  CoordinatorGrpcService(CoordinatorHandler* handler, CoordinatorMetrics* metrics,
                         const CoordinatorGrpcServiceOptions& options = {})
      : handler_(handler), metrics_(metrics), options_(options) {}
  ~CoordinatorGrpcService() override;

  // Open sessions end (UNAVAILABLE or CANCELLED for their clients) at once; call before
  // grpc::Server::Shutdown so that it does not wait for them.
  void Shutdown();

  int open_sessions() const { return open_sessions_.load(); }

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status KvSet(grpc::ServerContext* context, const v1::KvSetRequest* request,
                     v1::KvSetResponse* response) override;
  grpc::Status KvGet(grpc::ServerContext* context, const v1::KvGetRequest* request,
                     v1::KvGetResponse* response) override;
  grpc::Status Lease(grpc::ServerContext* context, const v1::LeaseRequest* request,
                     v1::LeaseResponse* response) override;
  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::JobEvent, v1::Heartbeat>* stream) override;
  grpc::Status ReportStats(grpc::ServerContext* context, const v1::StatsReport* request,
                           v1::StatsReportResponse* response) override;
  grpc::Status ReportFailure(grpc::ServerContext* context, const v1::FailureReport* request,
                             v1::JobStatus* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::JobStatus* response) override;
  grpc::Status ListMembers(grpc::ServerContext* context, const v1::ListMembersRequest* request,
                           v1::ListMembersResponse* response) override;
  grpc::Status Freeze(grpc::ServerContext* context, const v1::FreezeRequest* request,
                      v1::JobStatus* response) override;
  grpc::Status DelayFreeze(grpc::ServerContext* context, const v1::DelayFreezeRequest* request,
                           v1::JobStatus* response) override;
  grpc::Status Stop(grpc::ServerContext* context, const v1::StopRequest* request,
                    v1::JobStatus* response) override;
  grpc::Status CommitPart(grpc::ServerContext* context, const v1::CommitPartRequest* request,
                          v1::CommitPartResponse* response) override;
  grpc::Status Checkpoint(grpc::ServerContext* context, const v1::CheckpointRequest* request,
                          v1::CheckpointInfo* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;

 private:
  template <typename Response>
  grpc::Status Reply(const char* method, absl::StatusOr<Response> result, Response* response);
  // OK when the caller's authorization metadata grants `access`; else the refusal (counted
  // as an error of `method`).
  absl::Status Authorize(const char* method, security::Access access,
                         const grpc::ServerContext* context);

  // An open Session's wake-up: what the watcher and the session's reader tell its writer.
  struct SessionState {
    absl::Mutex mu;
    bool got_heartbeat ABSL_GUARDED_BY(mu) = false;
    bool reader_done ABSL_GUARDED_BY(mu) = false;
    bool shutting_down ABSL_GUARDED_BY(mu) = false;
    absl::Status error ABSL_GUARDED_BY(mu);
    // The newest job event the watcher saw and its version (0: none yet).
    std::shared_ptr<const v1::JobEvent> latest ABSL_GUARDED_BY(mu);
    uint64_t latest_version ABSL_GUARDED_BY(mu) = 0;
  };
  void AddSession(SessionState* session) ABSL_LOCKS_EXCLUDED(sessions_mu_);
  void RemoveSession(SessionState* session) ABSL_LOCKS_EXCLUDED(sessions_mu_);
  // The watcher: waits for job changes until Shutdown, and hands each to every session.
  void WatchJob();

  CoordinatorHandler* const handler_;
  CoordinatorMetrics* const metrics_;
  const CoordinatorGrpcServiceOptions options_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> open_sessions_{0};

  absl::Mutex sessions_mu_;
  absl::flat_hash_set<SessionState*> sessions_ ABSL_GUARDED_BY(sessions_mu_);
  std::shared_ptr<const v1::JobEvent> latest_ ABSL_GUARDED_BY(sessions_mu_);
  uint64_t latest_version_ ABSL_GUARDED_BY(sessions_mu_) = 0;
  std::thread watcher_ ABSL_GUARDED_BY(sessions_mu_);  // started with the first session
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_GRPC_SERVICE_H_
