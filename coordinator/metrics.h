// The coordinator's job-level Prometheus metrics (served on /metrics by CoordinatorServer).
// Thread-safe: prometheus-cpp metrics are atomic, families lock.
//
//   onebit_coordinator_stage                 0 warmup, 1 compression (of the most advanced worker)
//   onebit_coordinator_step                  highest completed step reported
//   onebit_coordinator_freeze_step           last warmup step; -1 if none scheduled
//   onebit_coordinator_max_lease_step        furthest step any worker may run
//   onebit_coordinator_stop_after_step       the job ends after this step
//   onebit_coordinator_world_size            workers in the job config
//   onebit_coordinator_workers_registered / _workers_alive
//   onebit_coordinator_servers_registered / _servers_alive
//   onebit_coordinator_loss                  loss of the latest stats report (absent before
//                                            the first step)
//   onebit_coordinator_variance_change       latest measured variance change (absent before
//                                            the first measurement)
//   onebit_coordinator_freeze_threshold      automatic freezing only: the variance change
//                                            must stay under it ...
//   onebit_coordinator_freeze_reports_in_a_row  ... for this many reports in a row ...
//   onebit_coordinator_freeze_min_warmup_step   ... but not before this step;
//   onebit_coordinator_freeze_max_warmup_step   freeze here at the latest
//   onebit_coordinator_kv_keys               keys in the rendezvous store
//   onebit_coordinator_leases_granted_total
//   onebit_coordinator_lease_seconds         histogram of Lease handling time
//   onebit_coordinator_heartbeat_seconds     histogram of handling a session's heartbeat
//                                            (the lock it waits for included)
//   onebit_coordinator_rpc_errors_total{method}  failed calls, gRPC and REST alike
//   onebit_coordinator_checkpoints_committed_total / _checkpoints_failed_total
//   onebit_coordinator_last_checkpoint_step  newest committed checkpoint; 0 if none
//   onebit_coordinator_checkpoint_commit_seconds  histogram of writing a manifest
//   onebit_coordinator_resumed_step          checkpoint this run resumed from; 0 if none
//   onebit_coordinator_resumed_errors_reset  1 if that resume reset the error buffers
//   onebit_coordinator_job_state             1 starting, 2 running, 3 recovering, 4 succeeded, 5 failed
//   onebit_coordinator_generation            membership generation (1 + recoveries)
//   onebit_coordinator_recoveries            recoveries so far, coordinator restarts included
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
  // those gauges are absent there.
  void SetAutomaticFreeze(double threshold, int reports_in_a_row, int64_t min_warmup,
                          int64_t max_warmup);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* stage_;
  prometheus::Gauge* step_;
  prometheus::Gauge* freeze_step_;
  prometheus::Gauge* max_lease_step_;
  prometheus::Gauge* stop_after_step_;
  prometheus::Gauge* world_size_;
  prometheus::Gauge* workers_registered_;
  prometheus::Gauge* workers_alive_;
  prometheus::Gauge* servers_registered_;
  prometheus::Gauge* servers_alive_;
  prometheus::Family<prometheus::Gauge>* loss_;             // added at the first step
  prometheus::Family<prometheus::Gauge>* variance_change_;  // added at the first report
  prometheus::Gauge* kv_keys_;
  prometheus::Counter* leases_granted_;
  prometheus::Histogram* lease_seconds_;
  prometheus::Histogram* heartbeat_seconds_;
  prometheus::Family<prometheus::Counter>* rpc_errors_;
  prometheus::Counter* checkpoints_committed_;
  prometheus::Counter* checkpoints_failed_;
  prometheus::Gauge* last_checkpoint_step_;
  prometheus::Histogram* checkpoint_commit_seconds_;
  prometheus::Gauge* resumed_step_;
  prometheus::Gauge* resumed_errors_reset_;
  prometheus::Gauge* job_state_;
  prometheus::Gauge* generation_;
  prometheus::Gauge* recoveries_;
};

}  // namespace onebit

#endif  // ONEBIT_COORDINATOR_METRICS_H_
