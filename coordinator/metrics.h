// The coordinator's job-level Prometheus metrics (served on /metrics by CoordinatorServer):
// each is documented at its member below, named onebit_coordinator_ and the member's name.
// Thread-safe: prometheus-cpp metrics are atomic, families lock.
#ifndef ONEBIT_COORDINATOR_METRICS_H_
#define ONEBIT_COORDINATOR_METRICS_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "onebit/v1/coordinator.pb.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace onebit {

class CoordinatorMetrics {
 public:
  CoordinatorMetrics();

  // What an Exposer serves.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Sets every job gauge from a status snapshot (alive counts included).
  void SetJob(const v1::JobStatus& job, int servers_alive);
  void SetKvKeys(size_t keys) { kv_keys_->Set(static_cast<double>(keys)); }
  void LeaseGranted() { leases_granted_->Increment(); }
  void ObserveLease(double seconds) { lease_seconds_->Observe(seconds); }
  void ObserveHeartbeat(double seconds) { heartbeat_seconds_->Observe(seconds); }
  void RpcError(absl::string_view method);
  void CheckpointCommitted(int64_t step, double seconds);
  void CheckpointFailed() { checkpoints_failed_->Increment(); }
  void Resumed(int64_t step, bool errors_reset);
  // The automatic freeze rule (FreezeConfig), exported once; not called in static mode, so
  // those gauges are absent there: _freeze_threshold (the variance change must stay under
  // it) for _freeze_reports_in_a_row reports in a row, not before _freeze_min_warmup_step;
  // _freeze_max_warmup_step: the freeze at the latest.
  void SetAutomaticFreeze(double threshold, int reports_in_a_row, int64_t min_warmup,
                          int64_t max_warmup);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* stage_;            // 0 warmup, 1 compression (of the most advanced worker)
  prometheus::Gauge* step_;             // highest completed step reported
  prometheus::Gauge* freeze_step_;      // last warmup step; -1 if none scheduled
  prometheus::Gauge* max_lease_step_;   // furthest step any worker may run
  prometheus::Gauge* stop_after_step_;  // the job ends after this step
  prometheus::Gauge* world_size_;       // workers in the job config
  prometheus::Gauge* workers_registered_;
  prometheus::Gauge* workers_alive_;
  prometheus::Gauge* servers_registered_;
  prometheus::Gauge* servers_alive_;
  // The latest stats report's (absent before the first step).
  prometheus::Family<prometheus::Gauge>* loss_;
  // The latest measured (absent before the first measurement).
  prometheus::Family<prometheus::Gauge>* variance_change_;
  prometheus::Gauge* kv_keys_;            // keys in the rendezvous store
  prometheus::Counter* leases_granted_;   // _total
  prometheus::Histogram* lease_seconds_;  // of Lease handling time
  // Of handling a session's heartbeat (the lock it waits for included).
  prometheus::Histogram* heartbeat_seconds_;
  prometheus::Family<prometheus::Counter>* rpc_errors_;  // _total{method}: failed calls, gRPC, REST
  prometheus::Counter* checkpoints_committed_;           // _total
  prometheus::Counter* checkpoints_failed_;              // _total
  prometheus::Gauge* last_checkpoint_step_;              // newest committed checkpoint; 0 if none
  prometheus::Histogram* checkpoint_commit_seconds_;     // of writing a manifest
  prometheus::Gauge* resumed_step_;          // checkpoint this run resumed from; 0 if none
  prometheus::Gauge* resumed_errors_reset_;  // 1 if that resume reset the error buffers
  // 1 starting, 2 running, 3 recovering, 4 succeeded, 5 failed.
  prometheus::Gauge* job_state_;
  prometheus::Gauge* generation_;  // membership generation (1 + recoveries)
  prometheus::Gauge* recoveries_;  // recoveries so far, coordinator restarts included
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_METRICS_H_
