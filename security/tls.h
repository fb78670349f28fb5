// TLS for every gRPC port of a job (the coordinator's and the shards'): credentials for
// servers and channels from PEM files, checked when they are loaded so that a wrong path
// or a key that does not belong to its certificate is an error naming the file, not a
// server that silently fails to start.
//
//   server: cert + key are its identity; with `mutual`, every client must present a
//           certificate that `ca_cert` verifies, or the handshake fails.
//   client: `ca_cert` verifies the server's certificate (against the host of the address
//           dialled, or `server_name`); cert + key, when given, are the client's identity.
//
// One certificate with both extended key usages (serverAuth, clientAuth) and a SAN for
// each address the process serves on can be every process's identity (a local job); a
// cluster gives each process its own. No options set (enabled() false) means plaintext,
// as before.
//
// Thread safety: free functions, no state.
#ifndef ONEBIT_SECURITY_TLS_H_
#define ONEBIT_SECURITY_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "security/tls_options.h"

namespace onebit::security {

// The PEM contents of the files of `options`, validated: each certificate file holds at
// least one X.509 certificate, the key parses and belongs to `cert`, no certificate of
// `cert` has expired. Errors name the file (NOT_FOUND: cannot read it; INVALID_ARGUMENT:
// not what it should be).
struct TlsMaterial {
  std::string ca_pem, cert_pem, key_pem;
};
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsOptions& options);

// Insecure credentials when !options.enabled(). A server needs cert and key (and ca_cert
// when mutual): INVALID_ARGUMENT otherwise.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsOptions& options);

// Insecure credentials when !options.enabled(). cert and key go together (INVALID_ARGUMENT
// otherwise); without ca_cert the system's roots verify the server.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(
    const TlsOptions& options);

// How long one connection attempt may take: gRPC's GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, which
// is its minimum connect timeout (TCP connect plus, with TLS, the handshake). Plaintext
// keeps `plaintext_ms` (short, so that a stopped peer is given up at once); with TLS it is
// at least 5 s: a handshake on a loaded machine can take longer than 100 ms, and an
// attempt cut short fails ("tcp handshaker shutdown") however often it is retried.
int ConnectTimeoutMs(const TlsOptions& options, int plaintext_ms);

// The channel arguments TLS needs on a client: the server name override, if any.
void AddTlsChannelArguments(const TlsOptions& options, grpc::ChannelArguments* args);

// What to add to an UNAVAILABLE message of a client with these options, so that a failed
// handshake reads as one: "" without TLS.
std::string HandshakeHint(const TlsOptions& options);

}  // namespace onebit::security

#endif  // ONEBIT_SECURITY_TLS_H_
