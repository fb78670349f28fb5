// The shard's Prometheus metrics (served at /metrics by ServerProcess):
//
//   onebit_server_steps_total{kind}              steps completed, kind = fp32 | onebit
//   onebit_server_step                           the last completed step
//   onebit_server_step_seconds                   histogram: first push of a step to its
//                                                result (waiting for the slowest worker
//                                                included)
//   onebit_server_bytes_received_total           push payload bytes (the proto payload
//                                                field; rejected pushes included)
//   onebit_server_bytes_sent_total               result payload bytes written back
//   onebit_server_error_norm                     ||server error||_2 after each onebit step
//                                                (absent before the first one)
//   onebit_server_rejected_pushes_total{reason}  see RejectReasonName
//   onebit_server_duplicate_pushes_total{kind}   repeated pushes (retries) that changed
//                                                nothing
//   onebit_server_info{shard,shards,workers}     1
//
// Thread safety: thread-safe (prometheus-cpp metrics are atomic). The registry is
// borrowed.
#ifndef ONEBIT_SERVER_SERVER_METRICS_H_
#define ONEBIT_SERVER_SERVER_METRICS_H_

#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/shard_state.h"

namespace onebit::server {

class ServerMetrics : public ShardObserver {
 public:
  ServerMetrics(prometheus::Registry& registry, const ShardConfig& config);

  void OnRejected(RejectReason reason) override;
  void OnDuplicate(ChunkKind kind) override;
  void OnStepCompleted(ChunkKind kind, int64_t step, absl::Duration open_for) override;
  void OnServerErrorNorm(double norm) override;

  void AddBytesReceived(uint64_t bytes) { bytes_received_.Increment(static_cast<double>(bytes)); }
  void AddBytesSent(uint64_t bytes) { bytes_sent_.Increment(static_cast<double>(bytes)); }

  // For tests.
  double bytes_received() const { return bytes_received_.Value(); }
  double bytes_sent() const { return bytes_sent_.Value(); }
  double rejected(RejectReason reason) const;

 private:
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& duplicates_;
  prometheus::Gauge& step_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& bytes_received_;
  prometheus::Counter& bytes_sent_;
  prometheus::Family<prometheus::Gauge>& error_norm_;  // its gauge added at the first value
};

}  // namespace onebit::server

#endif  // ONEBIT_SERVER_SERVER_METRICS_H_
