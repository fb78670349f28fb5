#include "worker/transport/call_trace.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace onebit {
namespace {

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

}  // namespace

CallTrace::CallTrace(std::ostream* out, Now now) : out_(out), now_(std::move(now)) {
  *out_ << "op,to,from,block_bytes,sent,received,start_unix,end_unix\n";
  out_->flush();
}

absl::StatusOr<std::unique_ptr<CallTrace>> CallTrace::Create(const std::string& path, Now now) {
  auto out = std::make_unique<std::ofstream>(path, std::ios::trunc);
  if (!out->is_open()) {
    return absl::InvalidArgumentError(absl::StrCat("transport trace: cannot write ", path));
  }
  auto trace = std::make_unique<CallTrace>(out.get(), std::move(now));
  trace->owned_out_ = std::move(out);
  return trace;
}

void CallTrace::Write(const CallLine& l) {
  *out_ << absl::StrFormat("%s%s,%d,%d,%u,%u,%u,%.6f,%.6f\n", l.op, l.ok ? "" : "!", l.to, l.from,
                           l.block_bytes, l.ok ? l.sent : 0, l.ok ? l.received : 0,
                           UnixSeconds(l.start), UnixSeconds(l.end));
  out_->flush();
}

}  // namespace onebit
