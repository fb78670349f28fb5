#include "coordinator/metrics.h"

#include <string>

namespace onebit {
namespace {

prometheus::Family<prometheus::Gauge>* GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Gauge* NewGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return &GaugeFamily(registry, name, help)->Add({});
}

// For the call latencies: 1-2.5-5 steps from 10 us to 1 s, fine enough to read a p99 from
// (tools/coordinator_load_main.cc does).
prometheus::Histogram::BucketBoundaries FineBuckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
          1e-2, 2.5e-2, 5e-2, 0.1,  0.25,   0.5,  1.0};
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  stage_ = NewGauge(r, "onebit_coordinator_stage",
                    "Stage of the most advanced worker: 0 warmup, 1 compression.");
  step_ = NewGauge(r, "onebit_coordinator_step", "Highest completed step any worker reported.");
  freeze_step_ = NewGauge(r, "onebit_coordinator_freeze_step",
                          "Last warmup step; -1 while no switch is scheduled.");
  max_lease_step_ = NewGauge(r, "onebit_coordinator_max_lease_step",
                             "Furthest step any worker may run without asking.");
  stop_after_step_ =
      NewGauge(r, "onebit_coordinator_stop_after_step", "The job ends after this step.");
  world_size_ = NewGauge(r, "onebit_coordinator_world_size", "Workers in the job config.");
  workers_registered_ =
      NewGauge(r, "onebit_coordinator_workers_registered", "Workers that registered.");
  workers_alive_ = NewGauge(r, "onebit_coordinator_workers_alive",
                            "Registered workers with a recent heartbeat.");
  servers_registered_ = NewGauge(r, "onebit_coordinator_servers_registered",
                                 "Parameter-server shards that registered.");
  servers_alive_ = NewGauge(r, "onebit_coordinator_servers_alive",
                            "Registered parameter-server shards with a recent heartbeat.");
  loss_ = GaugeFamily(r, "onebit_coordinator_loss", "Training loss of the latest stats report.");
  variance_change_ = GaugeFamily(r, "onebit_coordinator_variance_change",
                                 "Latest measured ||v_t - v_{t-k}|| / ||v_t|| (warmup).");
  kv_keys_ = NewGauge(r, "onebit_coordinator_kv_keys", "Keys in the rendezvous store.");
  leases_granted_ = &prometheus::BuildCounter()
                         .Name("onebit_coordinator_leases_granted_total")
                         .Help("Step leases granted.")
                         .Register(r)
                         .Add({});
  lease_seconds_ = &prometheus::BuildHistogram()
                        .Name("onebit_coordinator_lease_seconds")
                        .Help("Time to handle a Lease call, the wait for the lock included.")
                        .Register(r)
                        .Add({}, FineBuckets());
  heartbeat_seconds_ = &prometheus::BuildHistogram()
                            .Name("onebit_coordinator_heartbeat_seconds")
                            .Help("Time to handle one heartbeat of a session.")
                            .Register(r)
                            .Add({}, FineBuckets());
  rpc_errors_ = &prometheus::BuildCounter()
                     .Name("onebit_coordinator_rpc_errors_total")
                     .Help("Calls answered with an error, by method (gRPC and REST).")
                     .Register(r);
  checkpoints_committed_ = &prometheus::BuildCounter()
                                .Name("onebit_coordinator_checkpoints_committed_total")
                                .Help("Checkpoints whose manifest was written.")
                                .Register(r)
                                .Add({});
  checkpoints_failed_ = &prometheus::BuildCounter()
                             .Name("onebit_coordinator_checkpoints_failed_total")
                             .Help("Checkpoints whose manifest could not be written.")
                             .Register(r)
                             .Add({});
  last_checkpoint_step_ = NewGauge(r, "onebit_coordinator_last_checkpoint_step",
                                   "Step of the newest committed checkpoint; 0 if none.");
  checkpoint_commit_seconds_ = &prometheus::BuildHistogram()
                                    .Name("onebit_coordinator_checkpoint_commit_seconds")
                                    .Help("Time to write a checkpoint's manifest.")
                                    .Register(r)
                                    .Add({}, prometheus::Histogram::BucketBoundaries{
                                                 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0});
  resumed_step_ = NewGauge(r, "onebit_coordinator_resumed_step",
                           "Step of the checkpoint this run resumed from; 0 if none.");
  resumed_errors_reset_ = NewGauge(
      r, "onebit_coordinator_resumed_errors_reset",
      "1 if the resume reset the error buffers (another topology wrote the checkpoint).");
  job_state_ = NewGauge(r, "onebit_coordinator_job_state",
                        "1 starting, 2 running, 3 recovering, 4 succeeded, 5 failed.");
  generation_ = NewGauge(r, "onebit_coordinator_generation",
                         "Membership generation: 1, plus one per recovery.");
  recoveries_ = NewGauge(r, "onebit_coordinator_recoveries",
                         "Recoveries so far (a dead member, or a coordinator restart).");
  freeze_step_->Set(-1);
}

void CoordinatorMetrics::CheckpointCommitted(int64_t step, double seconds) {
  checkpoints_committed_->Increment();
  last_checkpoint_step_->Set(static_cast<double>(step));
  checkpoint_commit_seconds_->Observe(seconds);
}

void CoordinatorMetrics::SetAutomaticFreeze(double threshold, int reports_in_a_row,
                                            int64_t min_warmup, int64_t max_warmup) {
  prometheus::Registry& r = *registry_;
  NewGauge(r, "onebit_coordinator_freeze_threshold",
           "Automatic freezing: the variance change must stay under this threshold.")
      ->Set(threshold);
  NewGauge(r, "onebit_coordinator_freeze_reports_in_a_row",
           "Automatic freezing: reports under the threshold needed in a row.")
      ->Set(reports_in_a_row);
  NewGauge(r, "onebit_coordinator_freeze_min_warmup_step",
           "Automatic freezing: no freeze before this step.")
      ->Set(static_cast<double>(min_warmup));
  NewGauge(r, "onebit_coordinator_freeze_max_warmup_step",
           "Automatic freezing: the freeze happens at this step at the latest.")
      ->Set(static_cast<double>(max_warmup));
}

void CoordinatorMetrics::Resumed(int64_t step, bool errors_reset) {
  resumed_step_->Set(static_cast<double>(step));
  resumed_errors_reset_->Set(errors_reset ? 1 : 0);
}

void CoordinatorMetrics::SetJob(const v1::JobStatus& job, int servers_alive) {
  stage_->Set(job.stage() == v1::STAGE_COMPRESSION ? 1 : 0);
  step_->Set(static_cast<double>(job.step()));
  freeze_step_->Set(static_cast<double>(job.freeze_step()));
  max_lease_step_->Set(static_cast<double>(job.max_lease_step()));
  stop_after_step_->Set(static_cast<double>(job.stop_after_step()));
  world_size_->Set(job.world_size());
  workers_registered_->Set(job.workers_registered());
  workers_alive_->Set(job.workers_alive());
  servers_registered_->Set(job.servers_registered());
  servers_alive_->Set(servers_alive);
  // Absent until they exist (the proto's 0 means "none yet"; a measured variance change of
  // exactly 0 would need a variance that did not move at all).
  if (job.step() > 0) loss_->Add({}).Set(job.last_loss());
  if (job.last_variance_change() != 0.0) variance_change_->Add({}).Set(job.last_variance_change());
  last_checkpoint_step_->Set(static_cast<double>(job.last_checkpoint_step()));
  double state = 0;
  switch (job.state()) {
    case v1::JOB_STATE_STARTING: state = 1; break;
    case v1::JOB_STATE_RUNNING: state = 2; break;
    case v1::JOB_STATE_RECOVERING: state = 3; break;
    case v1::JOB_STATE_SUCCEEDED: state = 4; break;
    case v1::JOB_STATE_FAILED: state = 5; break;
    default: break;
  }
  job_state_->Set(state);
  generation_->Set(static_cast<double>(job.generation()));
  recoveries_->Set(job.recoveries());
}

void CoordinatorMetrics::RpcError(absl::string_view method) {
  rpc_errors_->Add({{"method", std::string(method)}}).Increment();
}

}  // namespace onebit
