#include "worker/local_group.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/gloo_transport.h"
#include "worker/inproc_transport.h"

namespace onebit {

absl::StatusOr<TransportKind> ParseTransportKind(absl::string_view name) {
  if (name == "inproc") return TransportKind::kInproc;
  if (name == "gloo") return TransportKind::kGloo;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transport '", name, "' (expected inproc or gloo)"));
}

std::string TransportKindName(TransportKind kind) {
  return kind == TransportKind::kInproc ? "inproc" : "gloo";
}

absl::Status RunLocalGroup(TransportKind kind, int world_size,
                           const std::function<absl::Status(Transport&)>& body) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be >= 1, got ", world_size));
  }
  std::shared_ptr<InprocHub> hub;
  std::shared_ptr<gloo::rendezvous::Store> store;
  if (kind == TransportKind::kInproc) {
    auto created = InprocHub::Create(world_size);
    if (!created.ok()) return created.status();
    hub = *std::move(created);
  } else {
    store = NewInMemoryStore();
  }

  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      absl::Status status;
      std::unique_ptr<Transport> transport;
      if (kind == TransportKind::kInproc) {
        auto t = hub->Connect(rank);
        if (t.ok()) transport = *std::move(t); else status = t.status();
      } else {
        auto t = GlooTransport::Create(store, rank, world_size);
        if (t.ok()) transport = *std::move(t); else status = t.status();
      }
      if (status.ok()) status = body(*transport);
      if (!status.ok() && hub) hub->Abort(absl::AbortedError(absl::StrCat("rank ", rank, " failed")));
      // A failed gloo rank closes its connections here, which unblocks its peers.
      transport.reset();
      results[rank] = status;
    });
  }
  for (std::thread& t : threads) t.join();
  // Prefer the root cause: the first rank whose error is not the abort it caused.
  for (int rank = 0; rank < world_size; ++rank) {
    if (!results[rank].ok() && results[rank].code() != absl::StatusCode::kAborted) {
      return absl::Status(results[rank].code(),
                          absl::StrCat("rank ", rank, ": ", results[rank].message()));
    }
  }
  for (int rank = 0; rank < world_size; ++rank) {
    if (!results[rank].ok()) {
      return absl::Status(results[rank].code(),
                          absl::StrCat("rank ", rank, ": ", results[rank].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace onebit
