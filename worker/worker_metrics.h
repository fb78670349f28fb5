// The worker's Prometheus metrics (DESIGN.md, "Metrics"), fed by the Trainer through
// TrainerMetricsSink, and the /metrics endpoint that serves them.
//
//   onebit_worker_stage                          0 = warmup, 1 = compression (last step)
//   onebit_worker_step                           the last completed step
//   onebit_worker_steps_total{stage}             steps run per stage
//   onebit_worker_step_seconds{part}             histogram; part = compute | exchange_update
//                                                (exchange_update: compression, exchange and
//                                                optimizer update, which run fused)
//   onebit_worker_bytes_sent_total{stage,link}   payload bytes this worker put on the wire
//                                                (link: intra_node or inter_node)
//   onebit_worker_bytes_received_total{stage,link} payload bytes it took off the wire
//   onebit_worker_compression_ratio              fp32 ring-allreduce bytes / bytes sent, last
//                                                step that sent anything
//   onebit_worker_loss                           training loss of the last step
//   onebit_worker_variance_change                ||v_t - v_{t-k}|| / ||v_t||, last report
//   onebit_worker_error_norm                     L2 norm of the worker error, last measured
//   onebit_worker_test_loss, onebit_worker_test_accuracy   last evaluation
//   onebit_worker_checkpoint_seconds             histogram: writing this worker's checkpoint
//                                                part (the training thread's pause)
//   onebit_worker_last_checkpoint_step           the last step it wrote a part after
//
// Every label value exists from the start, so dashboards see zeros instead of gaps.
// Thread safety: thread-safe (prometheus-cpp metrics are atomic).
#ifndef ONEBIT_WORKER_WORKER_METRICS_H_
#define ONEBIT_WORKER_WORKER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/trainer.h"

namespace onebit {

class WorkerMetrics : public TrainerMetricsSink {
 public:
  // Registers the families on `registry` (borrowed). `labels` (say {"rank", "3"}) go on
  // every series.
  explicit WorkerMetrics(prometheus::Registry& registry,
                         const std::map<std::string, std::string>& labels = {});

  void RecordStep(const StepReport& report) override;
  void RecordEval(int64_t step, const EvalResult& result) override;
  void RecordCheckpoint(int64_t step, double seconds) override;

 private:
  prometheus::Gauge& stage_;
  prometheus::Gauge& step_;
  prometheus::Counter& warmup_steps_;
  prometheus::Counter& compression_steps_;
  prometheus::Histogram& compute_seconds_;
  prometheus::Histogram& exchange_update_seconds_;
  // [stage][link]: stage 0 warmup, 1 compression; link 0 intra-node, 1 inter-node.
  prometheus::Counter* bytes_sent_[2][2];
  prometheus::Counter* bytes_received_[2][2];
  prometheus::Gauge& compression_ratio_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& variance_change_;
  prometheus::Gauge& error_norm_;
  prometheus::Gauge& test_loss_;
  prometheus::Gauge& test_accuracy_;
  prometheus::Histogram& checkpoint_seconds_;
  prometheus::Gauge& last_checkpoint_step_;
};

// A registry served over HTTP at /metrics.
class MetricsEndpoint {
 public:
  // Binds bind_address:port (port 0: a free one). kUnavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& bind_address = "0.0.0.0", int port = 0);

  prometheus::Registry& registry() { return *registry_; }
  int port() const { return port_; }  // the bound port

 private:
  MetricsEndpoint() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

// The registry in Prometheus' text format, as /metrics serves it (tests, debugging).
std::string SerializeMetrics(const prometheus::Registry& registry);

}  // namespace onebit

#endif  // ONEBIT_WORKER_WORKER_METRICS_H_
