// What a member process of a job (onebit-worker, onebit-server, a script through
// onebit.torch) does with the coordinator's word about the job: carry on, or leave with
// the exit code its supervisor acts on (docs/operate.md, "Exit codes", is the table users
// read; a supervisor must not restart a 2 or a 78).
#ifndef ONEBIT_COORDINATOR_MEMBER_H_
#define ONEBIT_COORDINATOR_MEMBER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/permanent_error.h"
#include "coordinator/coordinator_client.h"
#include "onebit/v1/coordinator.pb.h"

namespace onebit {

// The job succeeded (a shard leaves; a worker that ran its last step waits for it, so that
// a recovery in the last steps can restart it like any member).
inline constexpr int kMemberExitDone = 0;
// An error of this member's own, and the coordinator said nothing more: a restart may
// help (the job recovers, or the new process learns it is over). 2 (bad flags or config)
// is the binaries' own.
inline constexpr int kMemberExitFailed = 1;
// Restart me: the job recovers in a newer generation, or the coordinator no longer knows
// this member (it restarted, or replaced it); the new process registers again.
inline constexpr int kMemberExitRestart = 75;
// The job FAILED (its failure_reason says why): no restart fixes it (Kubernetes: a
// podFailurePolicy rule FailJob on 78). A coordinator restarted on a failed job stays
// FAILED and exits 78 too, so a supervisor that restarts everything repeats the same exit.
inline constexpr int kMemberExitJobFailed = 78;

// Reports `error` (common/permanent_error.h: one no restart fixes) as this member's permanent failure in `step` (0: none): the job fails
// at once, naming the member. Best effort: what the coordinator answered.
absl::Status ReportPermanentFailure(CoordinatorClient& client, v1::Role role, int rank,
                                    const std::string& instance_id, const absl::Status& error,
                                    int64_t step);

// Reports that this member stops for a reason of its own that a restart may fix (`why`: its
// training script raised) in `step` (0: none): a running job recovers at once, naming the
// member and `why`, where it would otherwise wait out a heartbeat timeout. Best effort.
absl::Status ReportRestartableFailure(CoordinatorClient& client, v1::Role role, int rank,
                                      const std::string& instance_id, const std::string& why,
                                      int64_t step);

// Who this member is in the job it registered with.
struct MemberIdentity {
  std::string job_id;      // RegisterResponse::job_id
  int64_t generation = 0;  // RegisterResponse::generation
  // A shard has nothing left to do once the job succeeded; a worker ends on its own.
  bool leave_on_success = false;
};

struct MemberVerdict {
  int exit_code = kMemberExitFailed;
  std::string reason;  // one line, for the member's log
};

// What `job` asks of `me`: nothing (carry on), or leave with a code and a reason.
std::optional<MemberVerdict> VerdictFor(const v1::JobStatus& job, const MemberIdentity& me);

// After an error that may have ended this member's part in the job (a call that failed):
// asks the coordinator where the job stands, for up to `wait` (the job may not have
// noticed yet why the error happened). Nothing by then: nullopt.
std::optional<MemberVerdict> AwaitVerdict(CoordinatorClient& client, const MemberIdentity& me,
                                          absl::Duration wait);

// The job's recoveries for a summary: "none", or "2: generation 2 resumed after step 40
// (worker 2 (w2) sent no heartbeat for 10s); generation 3 resumed from step 0 (...)".
std::string RecoveriesText(const v1::JobStatus& job);

// After this member's registration failed with `error`: 78 when the coordinator refused it
// because the job failed (FAILED_PRECONDITION, and the job's status says FAILED), else
// nothing (the caller's own exit code).
std::optional<MemberVerdict> VerdictAfterRegisterError(CoordinatorClient& client,
                                                       const absl::Status& error);

// After this member's session ended by itself (SessionOptions::on_end) with `why`: the
// coordinator refused the member (it does not know it) and the job's status says why, or
// 75 (a new process registers again); 75 at once when the session heard nothing for its
// silence_limit (ABORTED: cut off, counted dead); a coordinator out of reach for the
// session's whole give_up_after: 1. A member registers once per process: a coordinator
// that restarted (a new generation, its state reloaded from disk) no longer knows it, so
// answers its first heartbeat with the job's status and ends the session.
MemberVerdict VerdictAfterSessionEnd(CoordinatorClient& client, const MemberIdentity& me,
                                     const absl::Status& why);

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_MEMBER_H_
