#include "server/server_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace onebit::server {
namespace {

constexpr RejectReason kAllReasons[] = {
    RejectReason::kBadKind,      RejectReason::kUnknownWorker,
    RejectReason::kWrongChunk,   RejectReason::kBadStep,
    RejectReason::kWrongSize,    RejectReason::kBadScale,
    RejectReason::kStaleStep,    RejectReason::kStepAhead,
    RejectReason::kKindMismatch, RejectReason::kConflictingDuplicate,
};

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name,
                                                   const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

}  // namespace

ServerMetrics::ServerMetrics(prometheus::Registry& registry, const ShardConfig& config)
    : steps_(CounterFamily(registry, "onebit_server_steps_total", "Steps completed, by kind.")),
      rejected_(CounterFamily(registry, "onebit_server_rejected_pushes_total",
                              "Pushes rejected, by reason; none of them changed any state.")),
      duplicates_(CounterFamily(registry, "onebit_server_duplicate_pushes_total",
                                "Repeated pushes (retries) that changed nothing, by kind.")),
      step_(GaugeFamily(registry, "onebit_server_step", "The last completed step.").Add({})),
      step_seconds_(
          prometheus::BuildHistogram()
              .Name("onebit_server_step_seconds")
              .Help("From a step's first push to its result, in seconds.")
              .Register(registry)
              .Add({},
                   prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                           0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})),
      bytes_received_(CounterFamily(registry, "onebit_server_bytes_received_total",
                                    "Push payload bytes received.")
                          .Add({})),
      bytes_sent_(
          CounterFamily(registry, "onebit_server_bytes_sent_total", "Result payload bytes sent.")
              .Add({})),
      error_norm_(GaugeFamily(registry, "onebit_server_error_norm",
                              "L2 norm of this shard's server error after the last onebit step.")) {
  // Every label value exists from the start, so dashboards see zeros instead of gaps.
  for (ChunkKind kind : {ChunkKind::kFp32, ChunkKind::kOnebit}) {
    steps_.Add({{"kind", ChunkKindName(kind)}});
    duplicates_.Add({{"kind", ChunkKindName(kind)}});
  }
  for (RejectReason reason : kAllReasons) rejected_.Add({{"reason", RejectReasonName(reason)}});
  GaugeFamily(registry, "onebit_server_info", "This shard's place in the job.")
      .Add({{"shard", absl::StrCat(config.shard)},
            {"shards", absl::StrCat(config.num_shards)},
            {"workers", absl::StrCat(config.num_workers)}})
      .Set(1);
}

void ServerMetrics::OnRejected(RejectReason reason) {
  rejected_.Add({{"reason", RejectReasonName(reason)}}).Increment();
}

void ServerMetrics::OnDuplicate(ChunkKind kind) {
  duplicates_.Add({{"kind", ChunkKindName(kind)}}).Increment();
}

void ServerMetrics::OnStepCompleted(ChunkKind kind, int64_t step, absl::Duration open_for) {
  steps_.Add({{"kind", ChunkKindName(kind)}}).Increment();
  step_.Set(static_cast<double>(step));
  step_seconds_.Observe(absl::ToDoubleSeconds(open_for));
}

// Family::Add is thread-safe and returns the gauge once it exists.
void ServerMetrics::OnServerErrorNorm(double norm) { error_norm_.Add({}).Set(norm); }

double ServerMetrics::rejected(RejectReason reason) const {
  return rejected_.Add({{"reason", RejectReasonName(reason)}}).Value();
}

}  // namespace onebit::server
