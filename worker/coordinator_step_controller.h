// Leases from the coordinator (docs/design.md, "Step leases and the stage switch"), and
// the worker's reports to it: every variance change (automatic freezing needs them all), the first
// and last steps, and every `report_every`-th step for the job's metrics.
//
// OFF THE CRITICAL PATH: while a lease is held a step waits for no coordinator round
// trip. Reports go out in order from a thread of this class (Report returns at once);
// Acquire and EndAfter first wait until every queued report is delivered, so the
// coordinator has heard every variance change before it decides a lease, and the last
// step's report (the job ends when every worker's arrived) is sent before Report returns.
// So a report's round trip can still delay the step that asks for the next lease, when the
// lease is shorter than the reports' round trips.
// A report the coordinator could not take (UNAVAILABLE, DEADLINE_EXCEEDED,
// RESOURCE_EXHAUSTED: being restarted, say) is logged and dropped; any other answer (this
// member is unknown: a newer generation) is returned by the next Report, Acquire or
// EndAfter.
//
// Thread safety: one thread at a time calls the methods. The client is borrowed and must
// outlive this controller (whose destructor waits for the report in flight).
#ifndef ONEBIT_WORKER_COORDINATOR_STEP_CONTROLLER_H_
#define ONEBIT_WORKER_COORDINATOR_STEP_CONTROLLER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_client.h"
#include "worker/trainer.h"

namespace onebit {

class CoordinatorStepController : public StepController {
 public:
  CoordinatorStepController(CoordinatorClient* client, CoordinatorSession* session, int rank,
                            int64_t report_every, Exchange* exchange)
      : client_(client), session_(session), rank_(rank), report_every_(report_every),
        exchange_(exchange) {}
  ~CoordinatorStepController() override;

  // Asks until the coordinator grants a lease covering next_step or ends the job (it
  // holds leases back while a decision is pending, e.g. at max_warmup).
  absl::StatusOr<Lease> Acquire(int64_t next_step) override;
  absl::Status Report(const StepReport& report) override;
  // Reports the last step (if not yet) and tells the coordinator the loop ended there.
  absl::Status EndAfter(int64_t last_step) override;

  // The freeze step of the last lease (< 0: none).
  int64_t freeze_step() const { return freeze_step_; }

 private:
  CoordinatorClient* client_;
  CoordinatorSession* session_;
  const int rank_;
  const int64_t report_every_;
  Exchange* exchange_;
  int64_t freeze_step_ = -1;
  int64_t stop_after_step_ = -1;
  // The latest step's report, and the latest step the coordinator got a report of: a job
  // stopped "as soon as safe" ends at a step no lease named in advance, so the last step is
  // reported when the lease that ends the job arrives.
  std::optional<StepReport> last_;

  // The message of `report`, with the exchange's byte counters as they stand now.
  v1::StatsReport Message(const StepReport& report) const;
  // Sends `stats` now (after every queued report), and hands back the coordinator's answer.
  absl::Status SendNow(const v1::StatsReport& stats);
  // Queues `stats` for the thread.
  void Enqueue(v1::StatsReport stats);
  // Waits until nothing is queued or in flight; then the first undelivered report's error
  // that matters (see the header), which it clears.
  absl::Status Flush();
  // The thread's loop.
  void Run();
  // Whether a failed report's code is one a job survives (the report is dropped).
  static bool Droppable(absl::StatusCode code);

  absl::Mutex mu_;
  std::deque<v1::StatsReport> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int64_t last_reported_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // started with the first queued report
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_COORDINATOR_STEP_CONTROLLER_H_
