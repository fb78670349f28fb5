// The coordinator's request handlers, over the onebit.v1 messages and nothing of gRPC: the
// gRPC service (grpc_service.h) and the REST mirror (rest_mirror.h) both call one
// implementation (Coordinator, coordinator.h), so they cannot disagree. Errors are
// absl::Status, whose codes are gRPC's.
//
// Implementations are thread-safe. KvGet and WaitForJobChange may block (bounded).
#ifndef ONEBIT_COORDINATOR_COORDINATOR_HANDLER_H_
#define ONEBIT_COORDINATOR_COORDINATOR_HANDLER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "onebit/v1/coordinator.pb.h"

namespace onebit {

// Whether a member for job `key` belongs to the job of a coordinator with `coordinator_key`
// (RegisterRequest.job_key, JobStatus.job_key: a script's n-th optimizer). Keys are only
// compared when both sides have one (onebit-worker and onebit-coordinator give none).
inline bool SameJobKey(const std::string& key, const std::string& coordinator_key) {
  return key.empty() || coordinator_key.empty() || key == coordinator_key;
}

class CoordinatorHandler {
 public:
  virtual ~CoordinatorHandler() = default;

  // ---- processes of the job ----
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) = 0;
  virtual absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request) = 0;
  // With wait, blocks until the key is set, up to the request's timeout (bounded).
  virtual absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request) = 0;
  virtual absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) = 0;
  virtual absl::StatusOr<v1::StatsReportResponse> ReportStats(const v1::StatsReport& report) = 0;
  // A member's failure that no restart fixes: the job fails at once, naming it.
  virtual absl::StatusOr<v1::JobStatus> ReportFailure(const v1::FailureReport& report) = 0;

  // ---- the session stream, as two calls ----
  // One heartbeat of a session; an error ends the session with that status.
  virtual absl::Status Heartbeat(const v1::Heartbeat& heartbeat) = 0;
  // Blocks until the job's version differs from `seen_version` or `timeout` passes, and
  // returns the current version. The version changes whenever sessions should be sent a
  // JobEvent (stage, freeze or stop step, membership, liveness); progress alone (step,
  // loss) does not change it. Returns at once after shutdown.
  virtual uint64_t WaitForJobChange(uint64_t seen_version, absl::Duration timeout) = 0;

  // ---- admin (also on the REST mirror) ----
  virtual absl::StatusOr<v1::JobStatus> GetJob(const v1::GetJobRequest& request) = 0;
  virtual absl::StatusOr<v1::ListMembersResponse> ListMembers(
      const v1::ListMembersRequest& request) = 0;
  virtual absl::StatusOr<v1::JobStatus> Freeze(const v1::FreezeRequest& request) = 0;
  virtual absl::StatusOr<v1::JobStatus> DelayFreeze(const v1::DelayFreezeRequest& request) = 0;
  virtual absl::StatusOr<v1::JobStatus> Stop(const v1::StopRequest& request) = 0;
  virtual absl::StatusOr<v1::CommitPartResponse> CommitPart(const v1::CommitPartRequest& request) = 0;
  virtual absl::StatusOr<v1::CheckpointInfo> Checkpoint(const v1::CheckpointRequest& request) = 0;
  virtual absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& request) = 0;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_COORDINATOR_HANDLER_H_
