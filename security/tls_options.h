// What TLS a process uses on its gRPC ports and channels (security/tls.h makes the
// credentials). Plain data, no gRPC types, so client headers can hold it.
#ifndef ONEBIT_SECURITY_TLS_OPTIONS_H_
#define ONEBIT_SECURITY_TLS_OPTIONS_H_

#include <string>

namespace onebit::security {

struct TlsOptions {
  std::string ca_cert;  // PEM file of the CA (or CAs) the peer's certificate must chain to
  std::string cert;     // PEM file: this process's certificate (chain)
  std::string key;      // PEM file: its private key (unencrypted)
  // Servers: require and verify a client certificate (mutual TLS). Needs ca_cert.
  bool mutual = true;
  // Clients: check the server's certificate against this name instead of the address's
  // host (for certificates that name a service rather than every address).
  std::string server_name;

  bool enabled() const { return !ca_cert.empty() || !cert.empty() || !key.empty(); }
};

}  // namespace onebit::security

#endif  // ONEBIT_SECURITY_TLS_OPTIONS_H_
