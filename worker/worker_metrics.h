// The worker's Prometheus metrics (docs/design.md, "Observability"; the list is at
// WorkerMetrics), fed by the Trainer through TrainerMetricsSink, and the /metrics
// endpoint that serves them.
//
// Counters and histograms exist with every label value from the start, so rates see zeros
// instead of gaps. Gauges of a value that does not exist yet, or never will, are absent
// rather than 0: the loss before the first step, the variance change before its first
// report (it then keeps its last warmup value), the compression ratio before anything was
// sent, the error norm before the first compression step that measures it, the test loss
// before the first evaluation, the test accuracy of a workload that has none (synthetic),
// the last checkpoint step before the first checkpoint.
//
// Thread safety: thread-safe (prometheus-cpp metrics are atomic).
#ifndef ONEBIT_WORKER_WORKER_METRICS_H_
#define ONEBIT_WORKER_WORKER_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/trainer.h"

namespace onebit {

//   onebit_worker_stage                          0 = warmup, 1 = compression (last step)
//   onebit_worker_step                           the last completed step
//   onebit_worker_steps_total{stage}             steps run per stage
//   onebit_worker_step_seconds{part}             histogram; part = compute | compress |
//                                                exchange | update (StepReport: they add up
//                                                to the step; compress is 0 in warmup)
//   onebit_worker_bytes_sent_total{stage,link}   payload bytes this worker put on the wire
//                                                (link: intra_node or inter_node)
//   onebit_worker_bytes_received_total{stage,link} payload bytes it took off the wire
//   onebit_worker_device_bytes_total{stage,direction}  bytes the optimizer step copied
//                                                over PCIe (to_host, from_host); 0 on CPUs
//   onebit_worker_compression_ratio              fp32 ring-allreduce bytes / bytes sent, last
//                                                step that sent anything (about 1 in warmup)
//   onebit_worker_loss                           training loss of the last step
//   onebit_worker_variance_change                ||v_t - v_{t-k}|| / ||v_t||, last report
//   onebit_worker_error_norm                     L2 norm of the worker error, last measured
//   onebit_worker_test_loss, onebit_worker_test_accuracy   last evaluation
//   onebit_worker_checkpoint_seconds             histogram: writing this worker's checkpoint
//                                                part (the training thread's pause)
//   onebit_worker_last_checkpoint_step           the last step it wrote a part after
//   onebit_worker_state_bytes{part}              bytes of backend memory (device memory on
//                                                GPUs) the worker holds, by part: optimizer
//                                                (Optimizer::state_bytes: p, its state and
//                                                scratch, mask, clip copy) or exchange
//                                                (Exchange::buffer_bytes); from the start
class WorkerMetrics : public TrainerMetricsSink {
 public:
  // Registers the families on `registry` (borrowed). `labels` (say {"rank", "3"}) go on
  // every series.
  explicit WorkerMetrics(prometheus::Registry& registry,
                         const std::map<std::string, std::string>& labels = {});

  void RecordStep(const StepReport& report) override;
  void RecordEval(int64_t step, const EvalResult& result) override;
  void RecordCheckpoint(int64_t step, double seconds) override;
  void RecordStateBytes(uint64_t optimizer, uint64_t exchange) override;

 private:
  prometheus::Gauge& stage_;
  prometheus::Gauge& step_;
  prometheus::Counter& warmup_steps_;
  prometheus::Counter& compression_steps_;
  prometheus::Histogram& compute_seconds_;
  prometheus::Histogram& compress_seconds_;
  prometheus::Histogram& exchange_seconds_;
  prometheus::Histogram& update_seconds_;
  // [stage][link]: stage 0 warmup, 1 compression; link 0 intra-node, 1 inter-node.
  prometheus::Counter* bytes_sent_[2][2];
  prometheus::Counter* bytes_received_[2][2];
  // [stage][direction]: direction 0 to the host, 1 from it.
  prometheus::Counter* device_bytes_[2][2];
  // A gauge added to its family the first time it gets a value (on the trainer's thread).
  class LazyGauge {
   public:
    explicit LazyGauge(prometheus::Family<prometheus::Gauge>& family,
                       std::map<std::string, std::string> labels = {})
        : family_(family), labels_(std::move(labels)) {}
    void Set(double value) {
      if (gauge_ == nullptr) gauge_ = &family_.Add(labels_);
      gauge_->Set(value);
    }

   private:
    prometheus::Family<prometheus::Gauge>& family_;
    const std::map<std::string, std::string> labels_;
    prometheus::Gauge* gauge_ = nullptr;
  };
  LazyGauge compression_ratio_;
  LazyGauge loss_;
  LazyGauge variance_change_;
  LazyGauge error_norm_;
  prometheus::Gauge& masked_elements_;
  prometheus::Gauge& loss_scale_;
  prometheus::Counter& skipped_steps_;
  LazyGauge test_loss_;
  LazyGauge test_accuracy_;
  prometheus::Histogram& checkpoint_seconds_;
  LazyGauge last_checkpoint_step_;
  LazyGauge optimizer_state_bytes_;
  LazyGauge exchange_buffer_bytes_;
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
