// Leases from the coordinator (DESIGN.md, "Stage switch: step leases"), and the worker's
// reports to it: every variance change (automatic freezing needs them all), the first
// and last steps, and every `report_every`-th step for the job's metrics.
//
// Thread safety: one thread at a time. The client is borrowed.
#ifndef ONEBIT_WORKER_COORDINATOR_STEP_CONTROLLER_H_
#define ONEBIT_WORKER_COORDINATOR_STEP_CONTROLLER_H_

#include <optional>
#include <cstdint>

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
  int64_t last_reported_step_ = 0;

  absl::Status Send(const StepReport& report);
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_COORDINATOR_STEP_CONTROLLER_H_
