#include "coordinator/coordinator.h"

#include <limits>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/manifest.h"
#include "common/status_macros.h"
#include "config/optimizer_kind.h"
#include "coordinator/log.h"

namespace onebit {

absl::StatusOr<StageMachineOptions> StageMachineOptionsFromConfig(const JobConfig& config) {
  StageMachineOptions o;
  o.world_size = config.workers;
  o.lease_steps = config.lease_steps;
  o.total_steps = config.steps;
  if (!Traits(config.optimizer.kind).compresses) {
    o.policy = FreezePolicy::kNever;
  } else if (config.freeze.mode == "static") {
    o.policy = FreezePolicy::kStatic;
  } else if (config.freeze.mode == "automatic") {
    o.policy = FreezePolicy::kAutomatic;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "onebit.freeze.mode: must be static or automatic, got '", config.freeze.mode, "'"));
  }
  o.static_freeze_step = WarmupEndStep(config.optimizer);
  o.threshold = config.freeze.threshold;
  o.reports_in_a_row = config.freeze.reports_in_a_row;
  o.min_warmup = config.freeze.min_warmup;
  o.max_warmup = config.freeze.max_warmup;
  o.checkpoint_every = config.checkpoint.dir.empty() ? 0 : config.checkpoint.every_steps;
  absl::Status status = ValidateStageMachineOptions(o);
  if (!status.ok()) return status;
  return o;
}

namespace {

v1::FreezeMode FreezeModeOf(const StageMachineOptions& o) {
  switch (o.policy) {
    case FreezePolicy::kStatic:
      return v1::FREEZE_MODE_STATIC;
    case FreezePolicy::kAutomatic:
      return v1::FREEZE_MODE_AUTOMATIC;
    case FreezePolicy::kNever:
      break;
  }
  return v1::FREEZE_MODE_UNSPECIFIED;
}

std::string FreezeText(int64_t freeze_step) {
  return freeze_step < 0 ? std::string("no switch scheduled")
                         : absl::StrCat("switch after step ", freeze_step);
}

}  // namespace

bool Coordinator::Digest::operator==(const Digest& o) const {
  return state == o.state && generation == o.generation && stage == o.stage &&
         freeze_step == o.freeze_step && stop_after_step == o.stop_after_step &&
         workers_registered == o.workers_registered && workers_alive == o.workers_alive &&
         servers_registered == o.servers_registered && servers_alive == o.servers_alive;
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(const CoordinatorOptions& options,
                                                                 Clock* clock,
                                                                 CoordinatorMetrics* metrics) {
  if (clock == nullptr) return absl::InvalidArgumentError("clock is null");
  absl::StatusOr<StageMachineOptions> sm_options = StageMachineOptionsFromConfig(options.config);
  if (!sm_options.ok()) return sm_options.status();
  if (UsesServers(options.config.exchange) && options.config.exchange.servers < 1) {
    return absl::InvalidArgumentError("onebit.exchange.servers: must be >= 1 with shards");
  }
  if (options.config.exchange.servers < 0) {
    return absl::InvalidArgumentError("onebit.exchange.servers: must be >= 0");
  }
  if (options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat timeout must be positive");
  }
  if (options.resume.has_value()) {
    sm_options->resume_step = options.resume->step();
    sm_options->resume_freeze_step = options.resume_freeze_step;
  }
  if (options.generation < 1 || options.recoveries < 0) {
    return absl::InvalidArgumentError("generation must be >= 1 and recoveries >= 0");
  }
  absl::StatusOr<StageMachine> stage_machine = StageMachine::Create(*sm_options);
  if (!stage_machine.ok()) return stage_machine.status();
  return std::unique_ptr<Coordinator>(
      new Coordinator(options, clock, metrics, *std::move(stage_machine)));
}

Coordinator::Coordinator(const CoordinatorOptions& options, Clock* clock,
                         CoordinatorMetrics* metrics, StageMachine stage_machine)
    : options_(options),
      clock_(clock),
      metrics_(metrics),
      kv_(options.kv_limits),
      stage_machine_(std::move(stage_machine)),
      membership_(options.config.workers, ServerCount(options.config), options.heartbeat_timeout),
      checkpoints_(CheckpointCommitsOptions{options.job_id, checkpoint::TopologyKey(options.config),
                                            Traits(options.config.optimizer.kind).name,
                                            options.config.checkpoint.keep,
                                            options.commit_checkpoint},
                   clock, metrics) {
  absl::MutexLock lock(&mu_);
  resume_ = options_.resume;
  generation_ = options_.generation;
  recoveries_ = options_.recoveries;
  recovery_log_ = options_.recovery_log;
  state_ = options_.recovering ? v1::JOB_STATE_RECOVERING : v1::JOB_STATE_STARTING;
  if (!options_.failed.empty()) {
    state_ = v1::JOB_STATE_FAILED;
    failure_reason_ = options_.failed;
  }
  membership_deadline_ =
      clock_->Now() + absl::Seconds(options_.config.failure.rejoin_timeout_s);
  const v1::JobStatus job = JobLocked();
  digest_ = Digest{job.state(),
                   job.generation(),
                   job.stage(),
                   job.freeze_step(),
                   job.stop_after_step(),
                   job.workers_registered(),
                   job.workers_alive(),
                   job.servers_registered(),
                   membership_.Alive(v1::ROLE_SERVER, clock_->Now())};
  logged_freeze_step_ = stage_machine_.freeze_step();
  if (metrics_ != nullptr && options_.config.freeze.mode == "automatic") {
    const FreezeConfig& f = options_.config.freeze;
    metrics_->SetAutomaticFreeze(f.threshold, f.reports_in_a_row, f.min_warmup, f.max_warmup);
  }
  checkpoints_.SetFound(options_.committed);
  checkpoints_.ForgetAfter(resume_.has_value() ? resume_->step() : 0);
  if (state_ == v1::JOB_STATE_FAILED) {
    LogLine(absl::StrCat("job ", options_.job_id, " FAILED before this coordinator started, and "
                         "a restart cannot fix it: ", failure_reason_));
  } else if (options_.recovering) {
    // What this generation recovers from, for the members it refuses and for the status.
    // One failure, one recovery: a launcher restarts rank 0's coordinator after that
    // coordinator began recovering from a lost peer (recovery_goes_on).
    failure_reason_ = absl::StrCat(
        "the coordinator restarted",
        options_.recovery_goes_on ? absl::StrCat(" during recovery ", recoveries_) : "",
        "; generation ", generation_ - 1, " ended with it");
    if (recoveries_ > options_.config.failure.max_restarts) {
      FailLocked(absl::StrCat(failure_reason_, "; no recovery left (onebit.failure.max_restarts = ",
                              options_.config.failure.max_restarts, ")"));
    } else {
      RecordRecoveryLocked(failure_reason_, resume_.has_value() ? resume_->step() : 0);
      LogLine(absl::StrCat("recovering in generation ", generation_, " (recovery ", recoveries_,
                           " of at most ", options_.config.failure.max_restarts,
                           options_.recovery_goes_on ? ", which the last coordinator began" : "",
                           "): waiting for every member to register again"));
    }
  }
  if (options_.resume.has_value()) {
    LogLine(absl::StrCat("resuming from the checkpoint of step ", options_.resume->step(), " (",
                         options_.resume->name(), ")",
                         options_.resume->reset_errors()
                             ? absl::StrCat("; error buffers reset: ", options_.resume->reason())
                             : std::string("; every error buffer restored")));
  }
  LogLine(absl::StrCat("job ", options_.job_id, ": ", options_.config.workers, " workers, ",
                       ServerCount(options_.config), " servers",
                       ShardsSkipWarmup(options_.config.exchange)
                           ? " (the warmup between the workers)"
                           : "",
                       ", ",
                       options_.config.steps >= kOpenEndedSteps
                           ? std::string("steps until the workers' training loops end")
                           : absl::StrCat(options_.config.steps, " steps"),
                       ", ",
                       FreezeText(stage_machine_.freeze_step()),
                       stage_machine_.freeze_reason().empty()
                           ? ""
                           : absl::StrCat(" (", stage_machine_.freeze_reason(), ")")));
  if (metrics_ != nullptr) {
    metrics_->SetJob(job, digest_.servers_alive);
    if (options_.resume.has_value()) {
      metrics_->Resumed(options_.resume->step(), options_.resume->reset_errors());
    }
  }
}

v1::JobStatus Coordinator::JobLocked() const {
  const absl::Time now = clock_->Now();
  const StageMachine& sm = stage_machine_;
  v1::JobStatus job;
  job.set_job_id(options_.job_id);
  job.set_job_key(options_.job_key);
  job.set_stage(sm.Compresses(sm.max_reported_step()) ? v1::STAGE_COMPRESSION : v1::STAGE_WARMUP);
  job.set_step(sm.max_reported_step());
  job.set_freeze_step(sm.freeze_step());
  job.set_freeze_mode(FreezeModeOf(sm.options()));
  job.set_max_lease_step(sm.max_lease_step());
  job.set_stop_after_step(sm.stop_after_step());
  job.set_world_size(membership_.world_size());
  job.set_workers_registered(membership_.Registered(v1::ROLE_WORKER));
  job.set_num_servers(membership_.num_servers());
  job.set_servers_registered(membership_.Registered(v1::ROLE_SERVER));
  job.set_workers_alive(membership_.Alive(v1::ROLE_WORKER, now));
  job.set_last_loss(last_loss_);
  job.set_last_variance_change(last_variance_change_);
  job.set_exchange_mode(options_.config.exchange.mode);
  job.set_last_checkpoint_step(checkpoints_.last_committed_step());
  job.set_resumed_from_step(resume_.has_value() ? resume_->step() : 0);
  job.set_state(state_);
  job.set_failure_reason(failure_reason_);
  job.set_generation(generation_);
  job.set_recoveries(recoveries_);
  job.set_num_parameters(static_cast<int64_t>(NumParametersLocked()));
  for (const v1::Recovery& r : recovery_log_) *job.add_recovery_log() = r;
  return job;
}

void Coordinator::ChangedLocked() {
  CheckFailuresLocked();
  const v1::JobStatus job = JobLocked();
  const Digest digest{job.state(),
                      job.generation(),
                      job.stage(),
                      job.freeze_step(),
                      job.stop_after_step(),
                      job.workers_registered(),
                      job.workers_alive(),
                      job.servers_registered(),
                      membership_.Alive(v1::ROLE_SERVER, clock_->Now())};
  if (!(digest == digest_)) {
    if (digest.workers_alive != digest_.workers_alive ||
        digest.servers_alive != digest_.servers_alive) {
      LogLine(absl::StrCat("alive: ", digest.workers_alive, "/", job.world_size(), " workers, ",
                           digest.servers_alive, "/", job.num_servers(), " servers"));
    }
    if (digest.stage != digest_.stage && digest.stage == v1::STAGE_COMPRESSION) {
      LogLine(absl::StrCat("step ", job.step(), ": compression stage"));
    }
    digest_ = digest;
    ++version_;
    changed_.SignalAll();
  }
  if (stage_machine_.freeze_step() != logged_freeze_step_) {
    logged_freeze_step_ = stage_machine_.freeze_step();
    LogLine(logged_freeze_step_ < 0
                ? std::string("freeze cancelled: no switch scheduled")
                : absl::StrCat("switch to compression scheduled after step ", logged_freeze_step_,
                               " (", stage_machine_.freeze_reason(), "); leases through ",
                               stage_machine_.max_lease_step()));
  }
  if (metrics_ != nullptr) metrics_->SetJob(job, digest.servers_alive);
}

absl::Status Coordinator::CheckWorker(int rank) const {
  if (rank < 0 || rank >= membership_.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range [0, ", membership_.world_size(), ")"));
  }
  if (!membership_.IsRegistered(v1::ROLE_WORKER, rank)) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", rank, " is not registered; call Register first"));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::LoadedStateLocked(const v1::RegisterRequest& request) {
  const int64_t step = request.loaded_step();
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("loaded_step must be >= 0, got ", step));
  }
  const std::string who = absl::StrCat(
      "worker ", request.requested_rank() >= 0 ? absl::StrCat(request.requested_rank(), " ")
                                               : std::string(),
      "(", request.instance_id(), ")");
  auto describe = [](int64_t s) {
    return s > 0 ? absl::StrCat("a saved state of step ", s) : std::string("no saved state");
  };
  // The first worker to register in a generation says where its states start; the others
  // must say the same. (A member registering again says what it said.)
  if (first_loaded_.has_value()) {
    if (step != first_loaded_->first) {
      const std::string reason =
          absl::StrCat(who, " loaded ", describe(step), "; ", first_loaded_->second, " loaded ",
                       describe(first_loaded_->first),
                       ": every worker must load a state of the same step (or none)");
      FailLocked(reason);
      return absl::FailedPreconditionError(absl::StrCat("the job failed: ", reason));
    }
    return absl::OkStatus();
  }
  first_loaded_ = {step, who};
  if (step == 0) return absl::OkStatus();
  if (resume_.has_value() && !resume_->name().empty()) {
    // A checkpoint of the job holds more (the shards' errors, every worker's): it wins.
    LogLine(absl::StrCat(who, " loaded a saved state of step ", step, "; the job resumes from "
                         "its checkpoint of step ", resume_->step(), " instead"));
    return absl::OkStatus();
  }
  if (membership_.num_servers() > 0) {
    const std::string reason = absl::StrCat(
        who, " loaded a saved state of step ", step, ", which holds no shard's server error: "
        "a job with parameter-server shards resumes from its checkpoint.dir");
    FailLocked(reason);
    return absl::FailedPreconditionError(absl::StrCat("the job failed: ", reason));
  }
  absl::StatusOr<StageMachineOptions> sm_options = StageMachineOptionsFromConfig(options_.config);
  if (!sm_options.ok()) return sm_options.status();
  sm_options->resume_step = step;
  sm_options->resume_freeze_step = request.loaded_freeze_step();
  absl::StatusOr<StageMachine> sm = StageMachine::Create(*sm_options);
  if (!sm.ok()) {
    const std::string reason =
        absl::StrCat(who, " loaded a saved state of step ", step, " that this job cannot start "
                     "after: ", sm.status().message());
    FailLocked(reason);
    return absl::FailedPreconditionError(absl::StrCat("the job failed: ", reason));
  }
  stage_machine_ = *std::move(sm);
  v1::ResumeFrom resume;
  resume.set_step(step);
  resume.set_reason("the workers' loaded states");
  resume_ = resume;
  checkpoints_.ForgetAfter(step);
  LogLine(absl::StrCat("the job starts after step ", step, ": its workers loaded saved states "
                       "of that step (", who, " first)"));
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterResponse> Coordinator::Register(const v1::RegisterRequest& request) {
  absl::MutexLock lock(&mu_);
  if (!SameJobKey(request.job_key(), options_.job_key)) {
    return absl::UnavailableError(absl::StrCat(
        "this coordinator runs ", options_.job_key, " (job ", options_.job_id, "), and this ",
        RoleName(request.role()), " is for ", request.job_key(),
        ": retrying until that job's coordinator answers here"));
  }
  if (state_ == v1::JOB_STATE_FAILED || state_ == v1::JOB_STATE_SUCCEEDED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job is over (", state_ == v1::JOB_STATE_FAILED ? "failed: " + failure_reason_
                                                             : std::string("succeeded"), ")"));
  }
  // A new process asking for the rank of a member that has gone silent replaces it (an
  // orchestrator restarted it): recover at once instead of waiting out the rest of the
  // timeout, and register the newcomer in the new generation. A live member's rank is not
  // taken over: the newcomer gets RESOURCE_EXHAUSTED (and retries until the holder is
  // declared dead).
  const std::string holder = membership_.InstanceAt(request.role(), request.requested_rank());
  if (!holder.empty() && holder != request.instance_id() &&
      (state_ == v1::JOB_STATE_RUNNING || state_ == v1::JOB_STATE_STARTING)) {
    if (!membership_.IsAlive(request.role(), request.requested_rank(), clock_->Now())) {
      RecoverLocked(absl::StrCat(RoleName(request.role()), " ", request.requested_rank(), " (",
                                 holder, ") went silent and was replaced by a new process (",
                                 request.instance_id(), ")"));
      ChangedLocked();
      if (state_ == v1::JOB_STATE_FAILED) {
        return absl::FailedPreconditionError(absl::StrCat("the job failed: ", failure_reason_));
      }
    }
  }
  if (absl::Status fits = CheckFitsLocked(request); !fits.ok()) return fits;
  if (request.role() == v1::ROLE_WORKER) {
    if (absl::Status loaded = LoadedStateLocked(request); !loaded.ok()) {
      ChangedLocked();
      return loaded;
    }
  }
  const int before = membership_.Registered(request.role());
  absl::StatusOr<int> rank = membership_.Register(request, clock_->Now());
  if (!rank.ok()) return rank.status();
  if (membership_.Registered(request.role()) != before) {
    LogLine(absl::StrCat(RoleName(request.role()), " ", *rank, " registered: instance '",
                         request.instance_id(), "'",
                         request.address().empty() ? "" : absl::StrCat(" at ", request.address())));
  }
  v1::RegisterResponse response;
  response.set_rank(*rank);
  response.set_world_size(membership_.world_size());
  response.set_num_servers(membership_.num_servers());
  response.set_job_id(options_.job_id);
  if (resume_.has_value()) *response.mutable_resume() = *resume_;
  // Before ChangedLocked: should it start a recovery, this member hears of the newer
  // generation and restarts like everyone else.
  response.set_generation(generation_);
  ChangedLocked();
  return response;
}

absl::Status Coordinator::CheckFitsLocked(const v1::RegisterRequest& request) {
  const bool worker = request.role() == v1::ROLE_WORKER;
  if (worker && request.num_parameters() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_parameters must be >= 0, got ", request.num_parameters()));
  }
  const std::string name = absl::StrCat(
      RoleName(request.role()),
      request.requested_rank() >= 0 ? absl::StrCat(" ", request.requested_rank()) : std::string());
  const std::string who = absl::StrCat(name, " (", request.instance_id(), ")");
  std::string reason;
  const uint64_t want = NumParametersLocked();
  const uint64_t got = static_cast<uint64_t>(request.num_parameters());
  if (!request.job_terms().empty()) {
    const FirstTerms& first =
        first_terms_.try_emplace(request.role(), FirstTerms{request.job_terms(), name,
                                                            request.instance_id()})
            .first->second;
    if (first.terms != request.job_terms()) {
      reason = absl::StrCat(
          who, " has another config than ", first.name, " (", first.instance, "): ",
          JobTermsDifference(first.terms, request.job_terms(), first.name + "'s", 3), " (every ",
          RoleName(request.role()), " of a job trains with the same config)");
    }
  }
  if (reason.empty() && worker && got > 0 && want > 0 && got != want) {
    reason = absl::StrCat(who, " has a model of ", got, " parameters; the job's has ", want,
                          options_.num_parameters > 0 ? " (the job config's)"
                                                      : " (the first worker's)");
  }
  if (!reason.empty()) {
    FailLocked(reason);
    ChangedLocked();
    return absl::FailedPreconditionError(absl::StrCat("the job failed: ", reason));
  }
  if (worker && got > 0) learned_num_parameters_ = got;
  return absl::OkStatus();
}

absl::StatusOr<v1::KvSetResponse> Coordinator::KvSet(const v1::KvSetRequest& request) {
  absl::Status status = kv_.Set(request.key(), request.value());
  if (!status.ok()) return status;
  if (metrics_ != nullptr) metrics_->SetKvKeys(kv_.size());
  return v1::KvSetResponse();
}

absl::StatusOr<v1::KvGetResponse> Coordinator::KvGet(const v1::KvGetRequest& request) {
  if (request.timeout_ms() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms must be >= 0, got ", request.timeout_ms()));
  }
  // With wait, 0 (proto3's "unset") means as long as the coordinator allows.
  absl::Duration wait = absl::ZeroDuration();
  if (request.wait()) {
    wait = request.timeout_ms() == 0 ? kv_.limits().max_wait
                                     : absl::Milliseconds(request.timeout_ms());
  }
  absl::StatusOr<std::optional<std::string>> value = kv_.Get(request.key(), wait);
  if (!value.ok()) return value.status();
  v1::KvGetResponse response;
  response.set_found(value->has_value());
  if (value->has_value()) response.set_value(**value);
  return response;
}

absl::StatusOr<v1::LeaseResponse> Coordinator::Lease(const v1::LeaseRequest& request) {
  const absl::Time start = clock_->Now();  // the wait for the lock counts
  absl::MutexLock lock(&mu_);
  absl::Status status = CheckWorker(request.rank());
  if (!status.ok()) return status;
  if (request.ended()) return EndedLocked(request.rank(), request.next_step() - 1);
  absl::StatusOr<LeaseGrant> grant = stage_machine_.Lease(request.rank(), request.next_step());
  if (!grant.ok()) return grant.status();
  ChangedLocked();
  if (metrics_ != nullptr) {
    if (grant->through_step >= request.next_step()) metrics_->LeaseGranted();
    metrics_->ObserveLease(absl::ToDoubleSeconds(clock_->Now() - start));
  }
  v1::LeaseResponse response;
  response.set_through_step(grant->through_step);
  response.set_freeze_step(grant->freeze_step);
  response.set_stop_after_step(grant->stop_after_step);
  for (int64_t step : grant->checkpoint_steps) response.add_checkpoint_steps(step);
  const OptimizerConfig& o = options_.config.optimizer;
  if (Traits(o.kind).has_local_steps && grant->through_step >= request.next_step()) {
    // The switch as the lease schedules it (none yet: not within any lease's reach).
    const int64_t freeze = grant->freeze_step >= 0 ? grant->freeze_step
                                                   : std::numeric_limits<int64_t>::max();
    const int64_t first = request.next_step();
    if (!schedule_.has_value() || schedule_freeze_step_ != freeze || schedule_->steps() > first - 1) {
      schedule_ = ZeroOneSchedule(
          ZeroOneScheduleParams{o.var_update_scaler, o.local_step_scaler, o.local_step_clipper});
      schedule_freeze_step_ = freeze;
    }
    while (schedule_->steps() < first - 1) schedule_->Advance(freeze);
    ZeroOneSchedule ahead = *schedule_;
    response.set_exchange_schedule(true);
    for (int64_t t = first; t <= grant->through_step; ++t) {
      if (ahead.Next(freeze) != ZeroOneStep::kLocal) response.add_exchange_steps(t);
      ahead.Advance(freeze);
    }
  }
  return response;
}

absl::StatusOr<v1::StatsReportResponse> Coordinator::ReportStats(const v1::StatsReport& report) {
  if (report.stage() != v1::STAGE_WARMUP && report.stage() != v1::STAGE_COMPRESSION) {
    return absl::InvalidArgumentError("stage must be STAGE_WARMUP or STAGE_COMPRESSION");
  }
  if (report.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", report.step()));
  }
  if (!(report.step_seconds() >= 0) || std::isinf(report.step_seconds())) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_seconds must be a finite number >= 0, got ", report.step_seconds()));
  }
  absl::MutexLock lock(&mu_);
  absl::Status status = CheckWorker(report.rank());
  if (!status.ok()) return status;
  // A worker that disagrees about the stage of a step has a bug, and one that would break
  // the collectives: say so rather than average its numbers in.
  const bool compresses = stage_machine_.Compresses(report.step());
  if (compresses != (report.stage() == v1::STAGE_COMPRESSION)) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", report.rank(), " reports step ", report.step(), " in ",
                     report.stage() == v1::STAGE_COMPRESSION ? "compression" : "warmup", " but ",
                     FreezeText(stage_machine_.freeze_step())));
  }
  status = compresses ? stage_machine_.ReportProgress(report.rank(), report.step())
                      : stage_machine_.ReportVarianceChange(report.rank(), report.step(),
                                                            report.variance_change());
  if (!status.ok()) return status;
  if (report.hyper_digest() != 0) {
    status = CheckHypersLocked(report);
    if (!status.ok()) return status;
  }
  membership_.NoteStep(v1::ROLE_WORKER, report.rank(), report.step());
  if (!report.no_loss() && report.step() >= last_loss_step_) {
    last_loss_step_ = report.step();
    last_loss_ = report.loss();
  }
  const bool measured = report.variance_change() >= 0 || std::isnan(report.variance_change());
  if (!compresses && measured && report.step() >= last_variance_step_) {
    last_variance_step_ = report.step();
    last_variance_change_ = report.variance_change();
  }
  ChangedLocked();
  return v1::StatsReportResponse();
}

absl::Status Coordinator::CheckHypersLocked(const v1::StatsReport& report) {
  constexpr size_t kHyperStepsKept = 256;  // workers report the same steps, close together
  auto [it, first] = step_hypers_.try_emplace(
      report.step(), StepHypers{report.rank(), report.lr(), report.hyper_digest()});
  if (step_hypers_.size() > kHyperStepsKept) step_hypers_.erase(step_hypers_.begin());
  const StepHypers& seen = it->second;
  if (first || seen.digest == report.hyper_digest()) return absl::OkStatus();
  const std::string differs =
      seen.lr != report.lr()
          ? absl::StrCat("lr ", report.lr(), " against ", seen.lr)
          : absl::StrCat("the same lr ", report.lr(), " now; the lr, betas, weight decays or "
                         "clipping norm differed at this step or an earlier one");
  const std::string reason = absl::StrCat(
      "worker ", report.rank(), " stepped step ", report.step(), " with other hyperparameters "
      "than worker ", seen.rank, " (", differs, "): every worker must use the same learning "
      "rate, betas, weight decays and clipping at every step, or their replicas train apart; "
      "a schedule computed from each rank's own numbers (ReduceLROnPlateau on its own loss) "
      "does that: compute it from numbers every rank shares (an all-reduced metric)");
  if (state_ != v1::JOB_STATE_FAILED && state_ != v1::JOB_STATE_SUCCEEDED) {
    FailLocked(reason);
    ChangedLocked();
  }
  return absl::FailedPreconditionError(reason);
}

absl::Status Coordinator::Heartbeat(const v1::Heartbeat& heartbeat) {
  absl::MutexLock lock(&mu_);
  absl::Status status =
      membership_.CheckMember(heartbeat.role(), heartbeat.rank(), heartbeat.instance_id());
  if (!status.ok()) return status;
  if (heartbeat.role() == v1::ROLE_WORKER) {
    status = stage_machine_.ReportProgress(heartbeat.rank(), heartbeat.step());
    if (!status.ok()) return status;
  }
  status = membership_.Heartbeat(heartbeat, clock_->Now());
  if (!status.ok()) return status;
  ChangedLocked();
  return absl::OkStatus();
}

uint64_t Coordinator::WaitForJobChange(uint64_t seen_version, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  // A condition variable, not mu_.Await: a condition on mu_ is evaluated at every release
  // of mu_, which with a session per member made each call cost O(members).
  const absl::Time deadline = absl::Now() + timeout;
  while (!shut_down_ && version_ == seen_version) {
    if (changed_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return version_;
}

absl::StatusOr<v1::JobStatus> Coordinator::GetJob(const v1::GetJobRequest&) {
  absl::MutexLock lock(&mu_);
  return JobLocked();
}

absl::StatusOr<v1::ListMembersResponse> Coordinator::ListMembers(const v1::ListMembersRequest&) {
  absl::MutexLock lock(&mu_);
  v1::ListMembersResponse response;
  for (v1::Member& member : membership_.List(clock_->Now())) {
    *response.add_members() = std::move(member);
  }
  return response;
}

v1::JobStatus Coordinator::AdminDoneLocked(const std::string& what) {
  LogLine(absl::StrCat("operator: ", what, ": ", FreezeText(stage_machine_.freeze_step()),
                       ", stop after step ", stage_machine_.stop_after_step(), ", leases through ",
                       stage_machine_.max_lease_step()));
  ChangedLocked();
  return JobLocked();
}

absl::StatusOr<v1::JobStatus> Coordinator::Freeze(const v1::FreezeRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status status;
  std::string what;
  switch (request.when_case()) {
    case v1::FreezeRequest::kAtStep:
      status = stage_machine_.FreezeAt(request.at_step());
      what = absl::StrCat("freeze at step ", request.at_step());
      break;
    case v1::FreezeRequest::kNow:
      if (!request.now()) return absl::InvalidArgumentError("now must be true when set");
      status = stage_machine_.FreezeNow();
      what = "freeze now";
      break;
    default:
      return absl::InvalidArgumentError("set exactly one of at_step or now");
  }
  if (!status.ok()) return status;
  return AdminDoneLocked(what);
}

absl::StatusOr<v1::JobStatus> Coordinator::DelayFreeze(const v1::DelayFreezeRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::Status status = stage_machine_.DelayFreeze(request.to_step());
  if (!status.ok()) return status;
  return AdminDoneLocked(request.to_step() < 0
                             ? std::string("cancel freeze")
                             : absl::StrCat("delay freeze to step ", request.to_step()));
}

absl::StatusOr<v1::JobStatus> Coordinator::Stop(const v1::StopRequest& request) {
  if (request.now() && request.after_step() > 0) {
    return absl::InvalidArgumentError("set either now or after_step, not both");
  }
  // Stopping after step 0 only makes sense before any lease, where it is also what "as
  // soon as is safe" means; so proto3's unset 0 is read as "as soon as is safe".
  const bool asap = request.now() || request.after_step() <= 0;
  absl::MutexLock lock(&mu_);
  absl::Status status = stage_machine_.Stop(asap ? -1 : request.after_step());
  if (!status.ok()) return status;
  return AdminDoneLocked(asap ? std::string("stop as soon as safe")
                              : absl::StrCat("stop after step ", request.after_step()));
}

CheckpointFacts Coordinator::CheckpointFactsLocked() const {
  CheckpointFacts facts;
  facts.world_size = membership_.world_size();
  facts.num_servers = membership_.num_servers();
  facts.shards_skip_warmup = ShardsSkipWarmup(options_.config.exchange);
  facts.freeze_step = stage_machine_.freeze_step();
  facts.checkpoint_every = stage_machine_.options().checkpoint_every;
  facts.max_reported_step = stage_machine_.max_reported_step();
  facts.num_parameters = NumParametersLocked();
  return facts;
}

absl::StatusOr<v1::CommitPartResponse> Coordinator::CommitPart(const v1::CommitPartRequest& request) {
  ONEBIT_RETURN_IF_ERROR(checkpoints_.CheckEnabled());
  const v1::CheckpointPart& part = request.part();
  ONEBIT_RETURN_IF_ERROR(CheckpointCommits::ValidatePart(part));
  std::optional<ManifestWrite> write;
  {
    absl::MutexLock lock(&mu_);
    ONEBIT_RETURN_IF_ERROR(
        membership_.CheckMember(part.role(), part.rank(), request.instance_id()));
    auto response = checkpoints_.AddPart(request.step(), part, CheckpointFactsLocked(), &write);
    if (!response.ok() || !write.has_value()) return response;
  }
  // The last part: the manifest's I/O runs without the lock, so that leases, heartbeats and
  // reports go on meanwhile (CheckpointCommits says why).
  checkpoints_.Write(&*write);
  absl::MutexLock lock(&mu_);
  bool committed = false;
  auto response = checkpoints_.Finish(*write, CheckpointFactsLocked(), &committed);
  if (committed) ChangedLocked();
  return response;
}

absl::StatusOr<v1::CheckpointInfo> Coordinator::Checkpoint(const v1::CheckpointRequest& request) {
  ONEBIT_RETURN_IF_ERROR(checkpoints_.CheckEnabled());
  if (request.at_step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("at_step must be >= 0, got ", request.at_step()));
  }
  absl::MutexLock lock(&mu_);
  absl::StatusOr<int64_t> step = stage_machine_.RequestCheckpoint(request.at_step());
  if (!step.ok()) return step.status();
  return checkpoints_.Request(*step, CheckpointFactsLocked());
}

absl::StatusOr<v1::ListCheckpointsResponse> Coordinator::ListCheckpoints(
    const v1::ListCheckpointsRequest&) {
  absl::MutexLock lock(&mu_);
  return checkpoints_.List(CheckpointFactsLocked());
}

void Coordinator::CheckFailuresLocked() {
  if (state_ == v1::JOB_STATE_FAILED || state_ == v1::JOB_STATE_SUCCEEDED) return;
  if (state_ == v1::JOB_STATE_RUNNING && FinishedLocked()) {
    state_ = v1::JOB_STATE_SUCCEEDED;
    LogLine("job succeeded: every worker ran the last step");
    return;
  }
  const absl::Time now = clock_->Now();
  // The member that went silent first is the one that failed: the others often stop
  // because of it (their collectives with it broke), and may be silent by now too. A
  // worker that ran the job's last step may be gone already: that is no failure.
  if (auto silent = membership_.FirstSilent(now, stage_machine_.stop_after_step());
      silent.has_value()) {
    RecoverLocked(absl::StrCat(RoleName(silent->role), " ", silent->rank, " (",
                               silent->instance_id, ") sent no heartbeat for ",
                               absl::FormatDuration(options_.heartbeat_timeout)));
    return;
  }
  if (state_ == v1::JOB_STATE_STARTING || state_ == v1::JOB_STATE_RECOVERING) {
    const int workers = membership_.Registered(v1::ROLE_WORKER);
    const int servers = membership_.Registered(v1::ROLE_SERVER);
    if (workers == membership_.world_size() && servers == membership_.num_servers()) {
      LogLine(absl::StrCat("generation ", generation_, ": every member registered; running"));
      const bool recovered = state_ == v1::JOB_STATE_RECOVERING;
      state_ = v1::JOB_STATE_RUNNING;
      if (recovered) PersistLocked(/*over=*/false);  // a restart from here on is a new recovery
    } else if (now > membership_deadline_) {
      FailLocked(absl::StrCat(
          "only ", workers, " of ", membership_.world_size(), " workers and ", servers, " of ",
          membership_.num_servers(), " servers registered within ",
          options_.config.failure.rejoin_timeout_s, " s (onebit.failure.rejoin_timeout_s)",
          state_ == v1::JOB_STATE_RECOVERING ? absl::StrCat("; recovering from: ", failure_reason_)
                                             : std::string()));
    }
  }
}

void Coordinator::Abandon(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (state_ == v1::JOB_STATE_FAILED || state_ == v1::JOB_STATE_SUCCEEDED) return;
  FailLocked(reason);
  ChangedLocked();
}

void Coordinator::Recover(const std::string& what_failed) {
  absl::MutexLock lock(&mu_);
  if (state_ != v1::JOB_STATE_RUNNING) return;
  RecoverLocked(what_failed);
  ChangedLocked();
}

absl::StatusOr<v1::LeaseResponse> Coordinator::EndedLocked(int rank, int64_t last) {
  if (last < 0) {
    return absl::InvalidArgumentError(absl::StrCat("next_step must be >= 1, got ", last + 1));
  }
  ended_after_[rank] = last;
  for (const auto& [other, step] : ended_after_) {
    if (step != last) {
      const std::string reason = absl::StrCat(
          "worker ", rank, "'s training loop ended after step ", last, ", worker ", other,
          "'s after step ", step, ": every worker must run the same number of steps (a "
          "DistributedSampler gives each the same number of batches)");
      FailLocked(reason);
      ChangedLocked();
      return absl::FailedPreconditionError(reason);
    }
  }
  if (absl::Status s = stage_machine_.EndAfter(last); !s.ok()) {
    FailLocked(absl::StrCat("worker ", rank, "'s training loop ended after step ", last,
                            " while ", s.message()));
    ChangedLocked();
    return absl::FailedPreconditionError(failure_reason_);
  }
  if (ended_after_.size() == 1) {
    LogLine(absl::StrCat("worker ", rank, "'s training loop ended after step ", last,
                         ": the job ends there"));
  }
  // Its last step is done: count it, so that the job is over once every worker ended.
  (void)stage_machine_.ReportProgress(rank, last);
  ChangedLocked();
  v1::LeaseResponse response;
  response.set_through_step(last);
  response.set_freeze_step(stage_machine_.freeze_step());
  response.set_stop_after_step(stage_machine_.stop_after_step());
  return response;
}

void Coordinator::FailLocked(const std::string& reason) {
  state_ = v1::JOB_STATE_FAILED;
  failure_reason_ = reason;
  LogLine(absl::StrCat("job FAILED: ", reason));
  PersistLocked(/*over=*/true);
}

void Coordinator::PersistOver() {
  absl::MutexLock lock(&mu_);
  PersistLocked(/*over=*/true);
}

void Coordinator::PersistLocked(bool over) {
  if (!options_.persist) return;
  v1::CoordinatorState state;
  state.set_job_id(options_.job_id);
  state.set_generation(generation_);
  state.set_recoveries(recoveries_);
  state.set_over(over);
  state.set_recovering(!over && state_ == v1::JOB_STATE_RECOVERING);
  if (state_ == v1::JOB_STATE_FAILED) state.set_failure_reason(failure_reason_);
  for (const v1::Recovery& r : recovery_log_) *state.add_recovery_log() = r;
  const absl::Status saved = options_.persist(state);
  if (!saved.ok()) LogLine(absl::StrCat("cannot save the coordinator state: ", saved.message()));
}

void Coordinator::RecordRecoveryLocked(const std::string& what_failed, int64_t resume_step) {
  v1::Recovery& r = recovery_log_.emplace_back();
  r.set_generation(generation_);
  r.set_reason(what_failed);
  r.set_resume_step(resume_step);
  r.set_unix_ms(absl::ToUnixMillis(clock_->Now()));
  PersistLocked(/*over=*/false);
}

absl::StatusOr<v1::JobStatus> Coordinator::ReportFailure(const v1::FailureReport& report) {
  if (report.role() != v1::ROLE_WORKER && report.role() != v1::ROLE_SERVER) {
    return absl::InvalidArgumentError("role must be ROLE_WORKER or ROLE_SERVER");
  }
  if (report.reason().empty()) return absl::InvalidArgumentError("reason is required");
  if (report.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 0, got ", report.step()));
  }
  absl::MutexLock lock(&mu_);
  const std::string who = absl::StrCat(RoleName(report.role()), " ", report.rank(), " (",
                                       report.instance_id(), ")");
  if (report.instance_id().empty() ||
      membership_.InstanceAt(report.role(), report.rank()) != report.instance_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, " is not a member of generation ", generation_, ": its failure is not this one's"));
  }
  constexpr size_t kMaxReason = 1024;
  std::string reason = report.reason().substr(0, kMaxReason);
  if (report.reason().size() > kMaxReason) reason += "...";
  const std::string failed = absl::StrCat(
      who, " failed", report.step() > 0 ? absl::StrCat(" in step ", report.step()) : "",
      report.restartable() ? ", which a restart may fix: " : ", which no restart fixes: ",
      reason);
  if (report.restartable()) {
    // As Recover: a job that is starting, recovering or over is left as it is (the
    // member's registration or its silence acts there).
    if (state_ == v1::JOB_STATE_RUNNING) {
      RecoverLocked(failed);
      ChangedLocked();
    }
  } else if (state_ != v1::JOB_STATE_FAILED && state_ != v1::JOB_STATE_SUCCEEDED) {
    FailLocked(failed);
    ChangedLocked();
  }
  return JobLocked();
}

void Coordinator::RecoverLocked(const std::string& what_failed) {
  if (recoveries_ >= options_.config.failure.max_restarts) {
    FailLocked(absl::StrCat(what_failed, "; no recovery left (onebit.failure.max_restarts = ",
                            options_.config.failure.max_restarts, ")"));
    return;
  }
  std::optional<v1::ResumeFrom> resume;
  int64_t freeze_step = -1;
  std::optional<std::vector<v1::CheckpointManifest>> committed;
  if (options_.plan_resume) {
    checkpoints_.BeginRecovery();  // the disk holds every manifest that will be written
    absl::StatusOr<checkpoint::ResumePlan> plan = options_.plan_resume();
    if (!plan.ok()) {
      FailLocked(absl::StrCat(what_failed, "; cannot recover: ", plan.status().message()));
      return;
    }
    for (const std::string& line : plan->log) LogLine(line);
    resume = plan->resume;
    freeze_step = plan->freeze_step;
    committed = plan->committed;
  }
  absl::StatusOr<StageMachineOptions> sm_options = StageMachineOptionsFromConfig(options_.config);
  if (sm_options.ok() && resume.has_value()) {
    sm_options->resume_step = resume->step();
    sm_options->resume_freeze_step = freeze_step;
  }
  absl::StatusOr<StageMachine> sm =
      sm_options.ok() ? StageMachine::Create(*sm_options) : sm_options.status();
  if (!sm.ok()) {
    FailLocked(absl::StrCat(what_failed, "; cannot recover: ", sm.status().message()));
    return;
  }
  ++generation_;
  ++recoveries_;
  state_ = v1::JOB_STATE_RECOVERING;  // saved as recovering by the record
  RecordRecoveryLocked(what_failed, resume.has_value() ? resume->step() : 0);
  stage_machine_ = *std::move(sm);
  ended_after_.clear();
  step_hypers_.clear();
  membership_ = Membership(options_.config.workers, ServerCount(options_.config),
                           options_.heartbeat_timeout);
  checkpoints_.ClearPending();
  if (committed.has_value()) checkpoints_.SetFound(*committed);
  resume_ = resume;
  checkpoints_.ForgetAfter(resume.has_value() ? resume->step() : 0);
  first_loaded_.reset();  // the new generation's workers say again what they loaded
  last_loss_step_ = last_variance_step_ = -1;
  state_ = v1::JOB_STATE_RECOVERING;
  failure_reason_ = what_failed;
  membership_deadline_ = clock_->Now() + absl::Seconds(options_.config.failure.rejoin_timeout_s);
  LogLine(absl::StrCat("recovery ", recoveries_, " of at most ", options_.config.failure.max_restarts,
                       ": ", what_failed, "; generation ", generation_, " resumes from ",
                       resume.has_value() ? absl::StrCat("the checkpoint of step ", resume->step())
                                          : std::string("step 0 (no committed checkpoint)"),
                       " once every member registered again"));
}

void Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  ChangedLocked();
}

bool Coordinator::Finished() const {
  absl::MutexLock lock(&mu_);
  return state_ == v1::JOB_STATE_SUCCEEDED;
}

bool Coordinator::Failed() const {
  absl::MutexLock lock(&mu_);
  return state_ == v1::JOB_STATE_FAILED;
}

bool Coordinator::FinishedLocked() const {
  if (membership_.Registered(v1::ROLE_WORKER) != membership_.world_size()) return false;
  const int64_t last = stage_machine_.stop_after_step();
  // Resumed from the checkpoint of the last step (this coordinator stopped after it, before
  // the job's end was recorded): nothing is left to run, or to write.
  if (resume_.has_value() && resume_->step() >= last) return true;
  // A checkpoint whose parts are still coming in keeps the job open: its manifest is the
  // last thing a finished job writes.
  if (!stage_machine_.Finished() || checkpoints_.has_pending()) return false;
  // The parts of a checkpoint after the last step come after the workers' last reports;
  // those up to the resume point are the ones it resumed from.
  const int64_t first = resume_.has_value() ? resume_->step() + 1 : 1;
  const std::vector<int64_t> due = stage_machine_.CheckpointSteps(first, last);
  return !checkpoints_.enabled() || due.empty() || checkpoints_.last_committed_step() >= due.back();
}

void Coordinator::Shutdown() {
  kv_.Shutdown();
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  changed_.SignalAll();
}

}  // namespace onebit
