// CallTrace: a CSV file with one line per communication call, the format of a worker's
// --transport_trace (TracedTransport for the peer transports, PsExchange for the shards):
//
//   op,to,from,block_bytes,sent,received,start_unix,end_unix
//
// to and from are the peers (-1 where there is none), sent and received the bytes the call
// moved each way, start and end unix seconds on the clock of the worker's --history_csv.
// A failed call's op is suffixed "!". tools/bench/rounds.py reads it.
//
// Thread safety: one thread at a time. The stream is borrowed unless Create made it.
#ifndef ONEBIT_WORKER_TRANSPORT_CALL_TRACE_H_
#define ONEBIT_WORKER_TRANSPORT_CALL_TRACE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace onebit {

struct CallLine {
  absl::string_view op;
  int to = -1;
  int from = -1;
  size_t block_bytes = 0;
  uint64_t sent = 0;
  uint64_t received = 0;
  absl::Time start;
  absl::Time end;
  bool ok = true;  // false: op gets "!" and sent/received are written as 0
};

class CallTrace {
 public:
  using Now = std::function<absl::Time()>;

  // Writes the header to `out` at once. `now` is the clock (injected by tests).
  explicit CallTrace(std::ostream* out, Now now = &absl::Now);
  // A new file at `path` (truncated); INVALID_ARGUMENT when it cannot be opened.
  static absl::StatusOr<std::unique_ptr<CallTrace>> Create(const std::string& path,
                                                           Now now = &absl::Now);

  absl::Time now() const { return now_(); }
  // One line, written with one call and flushed: a process killed mid-run leaves a trace
  // that ends at a line.
  void Write(const CallLine& line);

 private:
  std::unique_ptr<std::ostream> owned_out_;  // Create's
  std::ostream* out_;
  Now now_;
};

}  // namespace onebit

#endif  // ONEBIT_WORKER_TRANSPORT_CALL_TRACE_H_
