#include "coordinator/inprocess_client.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace onebit {
namespace {

// Heartbeats every interval; between them, waits for job changes and reports each one,
// like the gRPC service's Session loop.
class InProcessSession final : public CoordinatorSession {
 public:
  InProcessSession(CoordinatorHandler* handler, const SessionOptions& options,
                   JobEventCallback on_event)
      : handler_(handler), options_(options), on_event_(std::move(on_event)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~InProcessSession() override { Stop().IgnoreError(); }

  void SetStep(int64_t step) override { step_.store(step); }

  absl::Status Stop() override {
    stopping_.store(true);
    if (thread_.joinable()) thread_.join();
    return status();
  }

  absl::Status status() const override {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  // A short wait, so that Stop() is noticed promptly.
  static constexpr absl::Duration kPoll = absl::Milliseconds(50);

  void Run() {
    v1::Heartbeat heartbeat;
    heartbeat.set_role(options_.role);
    heartbeat.set_rank(options_.rank);
    heartbeat.set_instance_id(options_.instance_id);
    uint64_t sent_version = 0;
    absl::Time next_heartbeat = absl::Now();
    while (!stopping_.load()) {
      if (absl::Now() >= next_heartbeat) {
        heartbeat.set_step(step_.load());
        absl::Status status = handler_->Heartbeat(heartbeat);
        if (!status.ok()) {
          // As the gRPC service does: the job's status first, then the refusal.
          absl::StatusOr<v1::JobStatus> job = handler_->GetJob(v1::GetJobRequest());
          if (job.ok() && on_event_) {
            v1::JobEvent event;
            *event.mutable_job() = *std::move(job);
            on_event_(event);
          }
          {
            absl::MutexLock lock(&mu_);
            status_ = status;
          }
          if (options_.on_end) options_.on_end(status);
          return;
        }
        next_heartbeat = absl::Now() + options_.heartbeat_interval;
      }
      const absl::Duration wait =
          sent_version == 0
              ? absl::ZeroDuration()
              : std::min(kPoll, std::max(absl::ZeroDuration(), next_heartbeat - absl::Now()));
      const absl::Time waited_from = absl::Now();
      const uint64_t version = handler_->WaitForJobChange(sent_version, wait);
      if (version == sent_version) {
        // A shut-down handler returns at once: do not spin.
        absl::SleepFor(wait - (absl::Now() - waited_from));
        continue;
      }
      absl::StatusOr<v1::JobStatus> job = handler_->GetJob(v1::GetJobRequest());
      if (!job.ok()) continue;
      v1::JobEvent event;
      *event.mutable_job() = *std::move(job);
      if (on_event_) on_event_(event);
      sent_version = version;
    }
  }

  CoordinatorHandler* const handler_;
  const SessionOptions options_;
  const JobEventCallback on_event_;
  std::atomic<int64_t> step_{0};
  std::atomic<bool> stopping_{false};
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class InProcessClient final : public CoordinatorClient {
 public:
  explicit InProcessClient(CoordinatorHandler* handler) : h_(handler) {}

  // Calls are function calls here: nothing waits on a network to cut (a waiting KvGet
  // already inside the coordinator finishes its wait); later calls fail.
  void Cancel() override { cancelled_ = true; }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& r) override {
    return Unless([&] { return h_->Register(r); });
  }
  absl::StatusOr<v1::KvSetResponse> KvSet(const v1::KvSetRequest& r) override {
    return Unless([&] { return h_->KvSet(r); });
  }
  absl::StatusOr<v1::KvGetResponse> KvGet(const v1::KvGetRequest& r) override {
    return Unless([&] { return h_->KvGet(r); });
  }
  absl::StatusOr<v1::LeaseResponse> Lease(const v1::LeaseRequest& r) override {
    return Unless([&] { return h_->Lease(r); });
  }
  absl::StatusOr<v1::StatsReportResponse> ReportStats(const v1::StatsReport& r) override {
    return Unless([&] { return h_->ReportStats(r); });
  }
  absl::StatusOr<v1::JobStatus> ReportFailure(const v1::FailureReport& r) override {
    return Unless([&] { return h_->ReportFailure(r); });
  }
  absl::StatusOr<std::unique_ptr<CoordinatorSession>> StartSession(
      const SessionOptions& options, JobEventCallback on_event) override {
    if (options.heartbeat_interval <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("heartbeat_interval must be positive");
    }
    return std::unique_ptr<CoordinatorSession>(
        new InProcessSession(h_, options, std::move(on_event)));
  }
  absl::StatusOr<v1::JobStatus> GetJob(const v1::GetJobRequest& r) override {
    return Unless([&] { return h_->GetJob(r); });
  }
  absl::StatusOr<v1::ListMembersResponse> ListMembers(const v1::ListMembersRequest& r) override {
    return Unless([&] { return h_->ListMembers(r); });
  }
  absl::StatusOr<v1::JobStatus> Freeze(const v1::FreezeRequest& r) override {
    return Unless([&] { return h_->Freeze(r); });
  }
  absl::StatusOr<v1::JobStatus> DelayFreeze(const v1::DelayFreezeRequest& r) override {
    return Unless([&] { return h_->DelayFreeze(r); });
  }
  absl::StatusOr<v1::JobStatus> Stop(const v1::StopRequest& r) override {
    return Unless([&] { return h_->Stop(r); });
  }
  absl::StatusOr<v1::CommitPartResponse> CommitPart(const v1::CommitPartRequest& r) override {
    return Unless([&] { return h_->CommitPart(r); });
  }
  absl::StatusOr<v1::CheckpointInfo> Checkpoint(const v1::CheckpointRequest& r) override {
    return Unless([&] { return h_->Checkpoint(r); });
  }
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints(
      const v1::ListCheckpointsRequest& r) override {
    return Unless([&] { return h_->ListCheckpoints(r); });
  }

 private:
  // `call`'s answer, or CANCELLED without calling once Cancel() was.
  template <typename Call>
  auto Unless(Call call) -> decltype(call()) {
    if (cancelled_.load()) {
      return absl::CancelledError("the in-process coordinator client was cancelled");
    }
    return call();
  }

  CoordinatorHandler* const h_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

std::unique_ptr<CoordinatorClient> NewInProcessCoordinatorClient(CoordinatorHandler* handler) {
  return std::make_unique<InProcessClient>(handler);
}

}  // namespace onebit
