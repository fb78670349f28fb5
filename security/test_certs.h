// For tests: a throw-away PKI made with the real openssl command at test time.
//
//   ca      a CA (self-signed, CA:TRUE)
//   node    signed by ca; SAN IP:127.0.0.1, DNS:localhost; serverAuth + clientAuth, so one
//           file is every process's identity in a local job
//   client  signed by ca; clientAuth only (a worker, or onebitctl)
//   rogue   self-signed, with node's subject and SANs: trusted by nobody
//
// Without openssl on PATH, MakeTestCerts fails with FAILED_PRECONDITION saying so (the
// tests that need it fail; they never pass without it).
#ifndef ONEBIT_SECURITY_TEST_CERTS_H_
#define ONEBIT_SECURITY_TEST_CERTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "security/tls.h"

namespace onebit::security {

struct TestCerts {
  std::string dir;
  std::string ca, ca_key;
  std::string node, node_key;
  std::string client, client_key;
  std::string rogue, rogue_key;

  // Options with `ca` as the CA and the given identity (cert and key paths; "" for none).
  TlsOptions With(const std::string& cert, const std::string& key) const {
    TlsOptions o;
    o.ca_cert = ca;
    o.cert = cert;
    o.key = key;
    return o;
  }
  TlsOptions Node() const { return With(node, node_key); }
  TlsOptions Client() const { return With(client, client_key); }
  TlsOptions Rogue() const { return With(rogue, rogue_key); }
  TlsOptions NoCert() const { return With("", ""); }
};

// The openssl binary on $PATH, or FAILED_PRECONDITION.
absl::StatusOr<std::string> FindOpenssl();

// Makes the files above in `dir` (created).
absl::StatusOr<TestCerts> MakeTestCerts(const std::string& dir);

// Writes `token` to `path` (mode 0600).
absl::Status WriteTokenFile(const std::string& path, const std::string& token);

}  // namespace onebit::security

#endif  // ONEBIT_SECURITY_TEST_CERTS_H_
