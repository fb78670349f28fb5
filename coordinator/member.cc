#include "coordinator/member.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace onebit {

namespace {

absl::Status Report(CoordinatorClient& client, v1::Role role, int rank,
                    const std::string& instance_id, const std::string& reason, int64_t step,
                    bool restartable) {
  v1::FailureReport report;
  report.set_role(role);
  report.set_rank(rank);
  report.set_instance_id(instance_id);
  report.set_reason(reason);
  report.set_step(step);
  report.set_restartable(restartable);
  return client.ReportFailure(report).status();
}

}  // namespace

absl::Status ReportPermanentFailure(CoordinatorClient& client, v1::Role role, int rank,
                                    const std::string& instance_id, const absl::Status& error,
                                    int64_t step) {
  return Report(client, role, rank, instance_id, std::string(error.message()), step,
                /*restartable=*/false);
}

absl::Status ReportRestartableFailure(CoordinatorClient& client, v1::Role role, int rank,
                                      const std::string& instance_id, const std::string& why,
                                      int64_t step) {
  return Report(client, role, rank, instance_id, why, step, /*restartable=*/true);
}

std::optional<MemberVerdict> VerdictFor(const v1::JobStatus& job, const MemberIdentity& me) {
  if (!me.job_id.empty() && !job.job_id().empty() && job.job_id() != me.job_id) {
    return MemberVerdict{kMemberExitRestart,
                         absl::StrCat("the coordinator now runs job ", job.job_id(), ", not ",
                                      me.job_id, "; exiting with ", kMemberExitRestart,
                                      " to be restarted")};
  }
  if (job.state() == v1::JOB_STATE_FAILED) {
    return MemberVerdict{kMemberExitJobFailed,
                         absl::StrCat("the job failed: ", job.failure_reason(), "; exiting with ",
                                      kMemberExitJobFailed, " (do not restart)")};
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

std::string RecoveriesText(const v1::JobStatus& job) {
  if (job.recoveries() == 0) return "none";
  std::string text = absl::StrCat(job.recoveries());
  const char* separator = ": ";
  for (const v1::Recovery& r : job.recovery_log()) {
    absl::StrAppend(&text, separator, "generation ", r.generation(),
                    r.resume_step() > 0 ? absl::StrCat(" resumed after step ", r.resume_step())
                                        : std::string(" restarted from step 0"),
                    " (", r.reason(), ")");
    separator = "; ";
  }
  return text;
}

std::optional<MemberVerdict> VerdictAfterRegisterError(CoordinatorClient& client,
                                                       const absl::Status& error) {
  if (!absl::IsFailedPrecondition(error)) return std::nullopt;
  absl::StatusOr<v1::JobStatus> job = client.GetJob({});
  if (!job.ok() || job->state() != v1::JOB_STATE_FAILED) return std::nullopt;
  return VerdictFor(*job, MemberIdentity{});
}

MemberVerdict VerdictAfterSessionEnd(CoordinatorClient& client, const MemberIdentity& me,
                                     const absl::Status& why) {
  // Its calls would wait out the same silence again.
  if (absl::IsUnavailable(why)) return MemberVerdict{kMemberExitFailed, std::string(why.message())};
  // Cut off for a heartbeat timeout (SessionOptions::silence_limit): the job recovers
  // without this member, or its coordinator is gone; either way a new process registers.
  if (absl::IsAborted(why)) {
    return MemberVerdict{kMemberExitRestart, absl::StrCat(why.message(), "; exiting with ",
                                                          kMemberExitRestart, " to be restarted")};
  }
  if (std::optional<MemberVerdict> verdict = AwaitVerdict(client, me, absl::Seconds(2))) {
    return *verdict;
  }
  return MemberVerdict{kMemberExitRestart, absl::StrCat(why.message(), "; exiting with ",
                                                        kMemberExitRestart, " to be restarted")};
}

}  // namespace onebit
