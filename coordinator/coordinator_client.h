// The client side of the coordinator, for workers, servers, onebitctl and launchers.
//
// CoordinatorClient mirrors the onebit.v1.Coordinator service call for call, over the same
// messages (proto/onebit/v1/coordinator.proto documents every field), with absl::Status
// errors carrying the coordinator's codes and messages unchanged:
//   INVALID_ARGUMENT     the request is malformed (fix the caller)
//   FAILED_PRECONDITION  the job is not in a state that allows it (e.g. not registered,
//                        a freeze step that is already leased); the message says why
//   ALREADY_EXISTS       a rendezvous key was already set to another value
//   RESOURCE_EXHAUSTED   no free rank, or the rendezvous store is full
//   DEADLINE_EXCEEDED    a waiting KvGet timed out, or the call's deadline passed
//   UNAVAILABLE          the coordinator cannot be reached (after retries, see below);
//                        with TLS on, also a failed handshake (the message says so)
//   UNAUTHENTICATED      the call needs a token (security/auth.h) and none or a wrong one
//                        was sent; PERMISSION_DENIED: the member token on an admin call
//   RESOURCE_EXHAUSTED   also: too many open sessions, or a message over the size limit
//
// Two implementations: NewGrpcCoordinatorClient (here) and an in-process one over a
// CoordinatorHandler (inprocess_client.h), for tests that need no network.
#ifndef ONEBIT_COORDINATOR_COORDINATOR_CLIENT_H_
#define ONEBIT_COORDINATOR_COORDINATOR_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "onebit/v1/coordinator.pb.h"
#include "security/tls_options.h"

namespace onebit {

// Who a session speaks for, and how often.
struct SessionOptions {
  v1::Role role = v1::ROLE_WORKER;
  int rank = 0;             // as Register assigned it
  std::string instance_id;  // as given to Register
  // Heartbeats go this often (the first at once); the coordinator declares a member dead
  // after its own timeout (onebit-coordinator --heartbeat_timeout) without one.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Called once, on the session's thread, when the session ends by itself rather than by
  // Stop(), with why: the coordinator refused this member (FAILED_PRECONDITION when it does
  // not know it: it restarted, or the member was replaced; it sends the job's status
  // first), or no stream reached it for `give_up_after` (UNAVAILABLE). The coordinator no
  // longer counts the member, so it must act (coordinator/member.h). It may end the
  // process; it must not call Stop() on its session.
  std::function<void(const absl::Status& why)> on_end;
  // How long the session reconnects to a coordinator it cannot reach before it ends.
  absl::Duration give_up_after = absl::InfiniteDuration();
  // Without a working stream to the coordinator for this long (its connection broke, and
  // none opened since; a link that went silent breaks it through GrpcClientOptions'
  // keepalive), the session ends with ABORTED: by then the coordinator, which heard no
  // heartbeat either, counts this member dead. Members set half the job's heartbeat
  // timeout (with the keepalive's half, the whole). Infinite: never. Not after the
  // coordinator said it is stopping (JobEvent.coordinator_stopping): a stop, or a restart
  // that will answer; then only give_up_after applies, until a stream works again.
  absl::Duration silence_limit = absl::InfiniteDuration();
};

// Called with every JobEvent: once after the first heartbeat, then whenever the job
// changes (stage, freeze or stop step, membership, liveness). Runs on the session's own
// thread, one call at a time; it must not call Stop() on its session.
using JobEventCallback = std::function<void(const v1::JobEvent& event)>;

// A live session: heartbeats in the background, reconnecting (with backoff) when the
// coordinator is unreachable or has its most sessions open (RESOURCE_EXHAUSTED), for up to
// SessionOptions::give_up_after.
// Thread-safe. Destroying it stops it.
class CoordinatorSession {
 public:
  virtual ~CoordinatorSession() = default;
  // The last completed step, sent with every heartbeat from now on.
  virtual void SetStep(int64_t step) = 0;
  // Ends the session and joins its threads. Returns the error that ended the session
  // before, if one did, else OK. Idempotent.
  virtual absl::Status Stop() = 0;
  // OK while the session runs (or reconnects); the error that ended it otherwise (e.g.
  // FAILED_PRECONDITION when the coordinator does not know this member).
  virtual absl::Status status() const = 0;
};

// Thread-safe: any number of calls may run at once.
class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;

  // ---- for the processes of a job; all idempotent, so retried when UNAVAILABLE ----
  // The same instance_id gets the same rank again.
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) = 0;
  // Keys are written once; the same value again is OK, another is ALREADY_EXISTS.
  virtual absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& request) = 0;
  // With wait, blocks until the key is set or timeout_ms passes (0: the coordinator's
  // bound, 30 s by default); the call's deadline is extended by the wait.
  virtual absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& request) = 0;
  virtual absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& request) = 0;
  // A repeated (rank, step) report is harmless.
  virtual absl::StatusOr<v1::StatsReportResponse> ReportStats(const v1::StatsReport& report) = 0;
  // Failing a job that failed already changes nothing (member.h: ReportPermanentFailure).
  virtual absl::StatusOr<v1::JobStatus> ReportFailure(const v1::FailureReport& report) = 0;
  virtual absl::StatusOr<std::unique_ptr<CoordinatorSession>> StartSession(
      const SessionOptions& options, JobEventCallback on_event) = 0;

  // ---- admin; GetJob and ListMembers are retried, the others are not ----
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

  // For a process that is shutting down and must not wait on a coordinator that may be
  // gone: every call in flight (and its retries and backoff) ends at once with CANCELLED,
  // and every later call fails the same way without trying. Sessions end by their own
  // Stop(). Irreversible; thread-safe.
  virtual void Cancel() = 0;
};

// Register, retrying RESOURCE_EXHAUSTED for up to `wait`: a process that replaces a dead
// member asks for its rank while the coordinator may still count the old one alive; once
// the old one's heartbeats have timed out the rank is free again (in a new generation).
absl::StatusOr<v1::RegisterResponse> RegisterReplacing(CoordinatorClient& client,
                                                       const v1::RegisterRequest& request,
                                                       absl::Duration wait);

// The largest coordinator message either way, on both sides (requests and answers are
// small: the biggest is a rendezvous value, at most 1 MiB, or a member list).
inline constexpr int kCoordinatorMaxMessageBytes = 4 << 20;


struct GrpcClientOptions {
  std::string address;  // host:port of the coordinator's gRPC service
  // TLS (security/tls.h): the CA that verifies the coordinator, and this process's
  // certificate and key for mutual TLS. Off (plaintext) when nothing is set.
  security::TlsOptions tls;
  // Sent as "authorization: Bearer <token>" with every call, sessions included
  // (security/auth.h): the member token for the job's processes, the admin token for an
  // operator. Empty: no authorization is sent.
  std::string token;
  // The deadline of every call (a waiting KvGet gets its wait on top).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Idempotent calls that fail with UNAVAILABLE are tried this many times in all, with
  // exponential backoff between tries.
  int max_attempts = 6;
  // When positive, idempotent calls are retried for this long instead (a coordinator that
  // restarts comes back within it): members use onebit.failure.coordinator_retry_s.
  absl::Duration retry_for = absl::ZeroDuration();
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // A connection of its own, even where another client of this process has one to the
  // same address (gRPC shares them by default): a load generator playing many members.
  bool own_connection = false;
  // Pings the coordinator's transport this often and drops a connection whose ping (or
  // heartbeat: TCP_USER_TIMEOUT) goes unanswered this long, so that a link that went
  // silent (no RST, no FIN) breaks the session's stream (SessionOptions::silence_limit).
  // Members set a quarter of the job's heartbeat timeout; infinite: no pings.
  absl::Duration keepalive = absl::InfiniteDuration();
};

// A client over gRPC (TLS when options.tls says so). INVALID_ARGUMENT for an empty address
// or bad options, an error naming the file for TLS files that do not load; the connection
// itself is made lazily, by the first call.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> NewGrpcCoordinatorClient(
    const GrpcClientOptions& options);

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_COORDINATOR_CLIENT_H_
