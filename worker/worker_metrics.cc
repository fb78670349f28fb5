#include "worker/worker_metrics.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace onebit {
namespace {

using Labels = std::map<std::string, std::string>;

prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                   const std::string& name, const std::string& help,
                                                   const Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(labels).Register(registry);
}

prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                       const std::string& name,
                                                       const std::string& help,
                                                       const Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(labels).Register(registry);
}

prometheus::Family<prometheus::Histogram>& StepSeconds(prometheus::Registry& registry,
                                                       const Labels& labels) {
  return prometheus::BuildHistogram()
      .Name("onebit_worker_step_seconds")
      .Help(
          "Time per step in seconds, by part: compute (the gradient), compress (compression "
          "with error feedback and server-side aggregation on this worker), exchange "
          "(transport, waiting for peers or shards) and update (the optimizer update). The "
          "parts add up to the step.")
      .Labels(labels)
      .Register(registry);
}

prometheus::Family<prometheus::Gauge>& StateBytes(prometheus::Registry& registry,
                                                  const Labels& labels) {
  return GaugeFamily(registry, "onebit_worker_state_bytes",
                     "Bytes of backend memory (device memory on GPUs) this worker holds, by "
                     "part: optimizer (parameters, optimizer state and scratch, momentum "
                     "mask, clip copy) or exchange (the exchange's buffers).",
                     labels);
}

prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

}  // namespace

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry, const Labels& labels)
    : stage_(GaugeFamily(registry, "onebit_worker_stage",
                         "Stage of the last step: 0 = warmup, 1 = compression.", labels)
                 .Add({})),
      step_(
          GaugeFamily(registry, "onebit_worker_step", "The last completed step.", labels).Add({})),
      warmup_steps_(
          CounterFamily(registry, "onebit_worker_steps_total", "Steps run, by stage.", labels)
              .Add({{"stage", "warmup"}})),
      compression_steps_(
          CounterFamily(registry, "onebit_worker_steps_total", "Steps run, by stage.", labels)
              .Add({{"stage", "compression"}})),
      compute_seconds_(StepSeconds(registry, labels).Add({{"part", "compute"}}, StepBuckets())),
      compress_seconds_(StepSeconds(registry, labels).Add({{"part", "compress"}}, StepBuckets())),
      exchange_seconds_(StepSeconds(registry, labels).Add({{"part", "exchange"}}, StepBuckets())),
      update_seconds_(StepSeconds(registry, labels).Add({{"part", "update"}}, StepBuckets())),
      compression_ratio_(
          GaugeFamily(registry, "onebit_worker_compression_ratio",
                      "Bytes an fp32 ring allreduce would send over bytes sent, last step that "
                      "sent anything.",
                      labels)),
      loss_(GaugeFamily(registry, "onebit_worker_loss",
                        "Training loss of the last step that had one (a training script may "
                        "hand the optimizer none).",
                        labels)),
      variance_change_(GaugeFamily(registry, "onebit_worker_variance_change",
                                   "||v_t - v_{t-k}|| / ||v_t|| at the last report (warmup).",
                                   labels)),
      error_norm_(GaugeFamily(registry, "onebit_worker_error_norm",
                              "L2 norm of the worker error, last measured.", labels)),
      masked_elements_(GaugeFamily(registry, "onebit_worker_momentum_masked_elements",
                                   "Parameters the momentum mask zeroes (the user's, and "
                                   "the automatic one from the switch on).",
                                   labels)
                           .Add({})),
      loss_scale_(GaugeFamily(registry, "onebit_worker_loss_scale",
                              "fp16's loss scale of the last step (0: no loss scaling).", labels)
                      .Add({})),
      skipped_steps_(CounterFamily(registry, "onebit_worker_overflow_skipped_steps_total",
                                   "Steps skipped by every worker because an fp16 gradient "
                                   "overflowed.",
                                   labels)
                         .Add({})),
      test_loss_(GaugeFamily(registry, "onebit_worker_test_loss",
                             "Test-set loss at the last evaluation.", labels)),
      test_accuracy_(GaugeFamily(registry, "onebit_worker_test_accuracy",
                                 "Test-set accuracy (0..1) at the last evaluation.", labels)),
      checkpoint_seconds_(prometheus::BuildHistogram()
                              .Name("onebit_worker_checkpoint_seconds")
                              .Help("Time the training thread spent writing this worker's "
                                    "checkpoint part.")
                              .Labels(labels)
                              .Register(registry)
                              .Add({}, StepBuckets())),
      last_checkpoint_step_(GaugeFamily(registry, "onebit_worker_last_checkpoint_step",
                                        "The last step this worker wrote a checkpoint part after.",
                                        labels)),
      optimizer_state_bytes_(StateBytes(registry, labels), {{"part", "optimizer"}}),
      exchange_buffer_bytes_(StateBytes(registry, labels), {{"part", "exchange"}}) {
  auto& sent = CounterFamily(registry, "onebit_worker_bytes_sent_total",
                             "Payload bytes sent, by stage and link (intra_node: inside this "
                             "worker's node; inter_node: between nodes).",
                             labels);
  auto& received = CounterFamily(registry, "onebit_worker_bytes_received_total",
                                 "Payload bytes received, by stage and link.", labels);
  auto& device = CounterFamily(registry, "onebit_worker_device_bytes_total",
                               "Bytes the optimizer step copied between the GPU and host "
                               "memory (PCIe), by stage and direction; 0 on CPUs.",
                               labels);
  const char* stages[2] = {"warmup", "compression"};
  const char* links[2] = {"intra_node", "inter_node"};
  const char* directions[2] = {"to_host", "from_host"};
  for (int s = 0; s < 2; ++s) {
    for (int l = 0; l < 2; ++l) {
      bytes_sent_[s][l] = &sent.Add({{"stage", stages[s]}, {"link", links[l]}});
      bytes_received_[s][l] = &received.Add({{"stage", stages[s]}, {"link", links[l]}});
      device_bytes_[s][l] = &device.Add({{"stage", stages[s]}, {"direction", directions[l]}});
    }
  }
}

void WorkerMetrics::RecordStep(const StepReport& report) {
  const bool warmup = report.stage == Stage::kWarmup;
  stage_.Set(warmup ? 0 : 1);
  step_.Set(static_cast<double>(report.step));
  (warmup ? warmup_steps_ : compression_steps_).Increment();
  compute_seconds_.Observe(report.compute_seconds);
  compress_seconds_.Observe(report.compress_seconds);
  exchange_seconds_.Observe(report.exchange_seconds);
  update_seconds_.Observe(report.update_seconds);
  const int s = warmup ? 0 : 1;
  bytes_sent_[s][0]->Increment(
      static_cast<double>(report.bytes_sent - report.inter_node_bytes_sent));
  bytes_sent_[s][1]->Increment(static_cast<double>(report.inter_node_bytes_sent));
  bytes_received_[s][0]->Increment(
      static_cast<double>(report.bytes_received - report.inter_node_bytes_received));
  bytes_received_[s][1]->Increment(static_cast<double>(report.inter_node_bytes_received));
  device_bytes_[s][0]->Increment(static_cast<double>(report.device_bytes_to_host));
  device_bytes_[s][1]->Increment(static_cast<double>(report.device_bytes_from_host));
  if (report.compression_ratio > 0) compression_ratio_.Set(report.compression_ratio);
  if (report.loss_given) loss_.Set(report.loss);
  if (report.variance_change.has_value()) variance_change_.Set(*report.variance_change);
  if (report.error_norm.has_value()) error_norm_.Set(*report.error_norm);
  masked_elements_.Set(static_cast<double>(report.masked_elements));
  loss_scale_.Set(report.loss_scale);
  if (report.skipped) skipped_steps_.Increment();
}

void WorkerMetrics::RecordCheckpoint(int64_t step, double seconds) {
  checkpoint_seconds_.Observe(seconds);
  last_checkpoint_step_.Set(static_cast<double>(step));
}

void WorkerMetrics::RecordStateBytes(uint64_t optimizer, uint64_t exchange) {
  optimizer_state_bytes_.Set(static_cast<double>(optimizer));
  exchange_buffer_bytes_.Set(static_cast<double>(exchange));
}

void WorkerMetrics::RecordEval(int64_t, const EvalResult& result) {
  test_loss_.Set(result.loss);
  if (result.accuracy.has_value()) test_accuracy_.Set(*result.accuracy);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& bind_address, int port) {
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->registry_ = std::make_shared<prometheus::Registry>();
  const std::string address = absl::StrCat(bind_address, ":", port);
  try {
    // civetweb's options spelled out: the (address, threads) constructor failed to start
    // here inside larger binaries, this form does not. A failed bind throws; keep
    // exceptions inside this call.
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", address, "num_threads", "2"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  }
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("no listening port for /metrics on ", address));
  }
  endpoint->port_ = ports.front();
  return endpoint;
}

std::string SerializeMetrics(const prometheus::Registry& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

}  // namespace onebit
