#include "coordinator/member.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace onebit {

std::optional<MemberVerdict> VerdictFor(const v1::JobStatus& job, const MemberIdentity& me) {
  if (!me.job_id.empty() && !job.job_id().empty() && job.job_id() != me.job_id) {
    return MemberVerdict{kMemberExitRestart,
                         absl::StrCat("the coordinator now runs job ", job.job_id(), ", not ",
                                      me.job_id, "; exiting with ", kMemberExitRestart,
                                      " to be restarted")};
  }
  if (job.state() == v1::JOB_STATE_FAILED) {
    return MemberVerdict{kMemberExitFailed, absl::StrCat("the job failed: ", job.failure_reason())};
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED && me.leave_on_success) {
    return MemberVerdict{kMemberExitDone, "the job succeeded"};
  }
  if (job.generation() > me.generation) {
    return MemberVerdict{kMemberExitRestart,
                         absl::StrCat("the job recovers in generation ", job.generation(), " (",
                                      job.failure_reason().empty() ? "the coordinator restarted"
                                                                   : job.failure_reason(),
                                      "); exiting with ", kMemberExitRestart, " to be restarted")};
  }
  return std::nullopt;
}

std::optional<MemberVerdict> AwaitVerdict(CoordinatorClient& client, const MemberIdentity& me,
                                          absl::Duration wait) {
  const absl::Time give_up = absl::Now() + wait;
  while (true) {
    absl::StatusOr<v1::JobStatus> job = client.GetJob({});
    if (job.ok()) {
      if (std::optional<MemberVerdict> verdict = VerdictFor(*job, me)) return verdict;
    }
    const absl::Duration left = give_up - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    absl::SleepFor(std::min(absl::Milliseconds(250), left));
  }
}

MemberVerdict VerdictAfterSessionEnd(CoordinatorClient& client, const MemberIdentity& me,
                                     const absl::Status& why) {
  // Its calls would wait out the same silence again.
  if (absl::IsUnavailable(why)) return MemberVerdict{kMemberExitFailed, std::string(why.message())};
  if (std::optional<MemberVerdict> verdict = AwaitVerdict(client, me, absl::Seconds(2))) {
    return *verdict;
  }
  return MemberVerdict{kMemberExitRestart, absl::StrCat(why.message(), "; exiting with ",
                                                        kMemberExitRestart, " to be restarted")};
}

}  // namespace onebit
