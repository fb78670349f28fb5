#include "worker/transport/local_group.h"

#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/gloo_transport.h"
#include "worker/transport/inproc_transport.h"

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

namespace {

constexpr int kConnectAttempts = 3;

// Connects every rank (collectively, one thread per rank). Returns all transports or the
// first error.
absl::StatusOr<std::vector<std::unique_ptr<Transport>>> ConnectGroup(TransportKind kind,
                                                                     int world_size) {
  std::vector<std::unique_ptr<Transport>> transports(world_size);
  if (kind == TransportKind::kInproc) {
    auto hub = InprocHub::Create(world_size);
    if (!hub.ok()) return hub.status();
    for (int rank = 0; rank < world_size; ++rank) {
      auto t = (*hub)->Connect(rank);
      if (!t.ok()) return t.status();
      transports[rank] = *std::move(t);
    }
    return transports;
  }
  std::shared_ptr<gloo::rendezvous::Store> store = NewInMemoryStore();
  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      auto t = GlooTransport::Create(store, rank, world_size);
      if (t.ok()) transports[rank] = *std::move(t); else results[rank] = t.status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return transports;
}

// ConnectGroup, retried: connecting a gloo mesh over loopback fails now and then on a
// loaded machine (a peer sees its connection closed during the handshake); a fresh store
// and fresh devices connect fine, so retry the whole group a few times before giving up.
absl::StatusOr<std::vector<std::unique_ptr<Transport>>> ConnectGroupWithRetries(
    TransportKind kind, int world_size) {
  absl::StatusOr<std::vector<std::unique_ptr<Transport>>> transports;
  for (int attempt = 1; attempt <= kConnectAttempts; ++attempt) {
    transports = ConnectGroup(kind, world_size);
    if (transports.ok() || transports.status().code() != absl::StatusCode::kUnavailable) break;
  }
  return transports;
}

// Runs body(w) on one thread per worker. The first worker to fail holds the root cause
// (the others fail because of it): its error is returned, prefixed with `what` and w, and
// close(w) runs at once so that its peers fail instead of waiting for it (gloo: closed
// connections; inproc: the hub is aborted).
absl::Status RunThreads(int count, const char* what, const std::function<absl::Status(int)>& body,
                        const std::function<void(int)>& close) {
  absl::Mutex mu;
  absl::Status first_failure;
  std::vector<std::thread> threads;
  for (int w = 0; w < count; ++w) {
    threads.emplace_back([&, w] {
      const absl::Status status = body(w);
      if (status.ok()) return;
      {
        absl::MutexLock lock(&mu);
        if (first_failure.ok()) {
          first_failure =
              absl::Status(status.code(), absl::StrCat(what, " ", w, ": ", status.message()));
        }
      }
      close(w);
    });
  }
  for (std::thread& t : threads) t.join();
  return first_failure;
}

}  // namespace

absl::Status RunLocalGroup(TransportKind kind, int world_size,
                           const std::function<absl::Status(Transport&)>& body) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size must be >= 1, got ", world_size));
  }
  auto transports = ConnectGroupWithRetries(kind, world_size);
  if (!transports.ok()) return transports.status();
  return RunThreads(
      world_size, "rank", [&](int rank) { return body(*(*transports)[rank]); },
      [&](int rank) { (*transports)[rank].reset(); });
}

absl::Status RunLocalNodes(
    TransportKind kind, int nodes, int local_size,
    const std::function<absl::Status(Transport& intra, Transport& inter)>& body) {
  if (nodes < 1 || local_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nodes and local size must be >= 1, got ", nodes, " x ", local_size));
  }
  // intra[node][l] and inter[l][node].
  std::vector<std::vector<std::unique_ptr<Transport>>> intra, inter;
  for (int node = 0; node < nodes; ++node) {
    auto group = ConnectGroupWithRetries(kind, local_size);
    if (!group.ok()) return group.status();
    intra.push_back(*std::move(group));
  }
  for (int l = 0; l < local_size; ++l) {
    auto group = ConnectGroupWithRetries(kind, nodes);
    if (!group.ok()) return group.status();
    inter.push_back(*std::move(group));
  }
  return RunThreads(
      nodes * local_size, "worker",
      [&](int w) { return body(*intra[w / local_size][w % local_size], *inter[w % local_size][w / local_size]); },
      [&](int w) {
        intra[w / local_size][w % local_size].reset();
        inter[w % local_size][w / local_size].reset();
      });
}

}  // namespace onebit
