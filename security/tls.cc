#include "security/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace onebit::security {
namespace {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the TLS ", what, " ", path));
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (text.size() > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("the TLS ", what, " ", path, " is over 1 MiB"));
  }
  return text;
}

// The last OpenSSL error as text (and the queue cleared), for messages.
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "no PEM data";
  char buffer[256];
  ERR_error_string_n(code, buffer, sizeof(buffer));
  return buffer;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioDeleter>;
using Cert = std::unique_ptr<X509, X509Deleter>;
using Key = std::unique_ptr<EVP_PKEY, KeyDeleter>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Every certificate in `pem`; INVALID_ARGUMENT naming `path` when there is none or one has
// expired.
absl::StatusOr<std::vector<Cert>> ParseCertificates(const std::string& pem,
                                                    const std::string& path, const char* what) {
  Bio bio = MemoryBio(pem);
  std::vector<Cert> certs;
  while (true) {
    Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    certs.push_back(std::move(cert));
  }
  ERR_clear_error();  // the end of the file reads as an error
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " ", path, " holds no PEM certificate"));
  }
  for (const Cert& cert : certs) {
    if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the TLS ", what, " ", path, " holds a certificate that has expired"));
    }
  }
  return certs;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsOptions& options) {
  if (options.cert.empty() != options.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a certificate and its key go together (give both, or neither)");
  }
  TlsMaterial m;
  if (!options.ca_cert.empty()) {
    ONEBIT_ASSIGN_OR_RETURN(m.ca_pem, ReadPemFile(options.ca_cert, "CA certificate"));
    ONEBIT_RETURN_IF_ERROR(ParseCertificates(m.ca_pem, options.ca_cert, "CA certificate").status());
  }
  if (!options.cert.empty()) {
    ONEBIT_ASSIGN_OR_RETURN(m.cert_pem, ReadPemFile(options.cert, "certificate"));
    ONEBIT_ASSIGN_OR_RETURN(std::vector<Cert> certs,
                            ParseCertificates(m.cert_pem, options.cert, "certificate"));
    ONEBIT_ASSIGN_OR_RETURN(m.key_pem, ReadPemFile(options.key, "key"));
    Bio bio = MemoryBio(m.key_pem);
    Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the TLS key ", options.key, " holds no unencrypted PEM private key (", OpenSslError(), ")"));
    }
    if (X509_check_private_key(certs.front().get(), key.get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat("the TLS key ", options.key,
                                                     " does not belong to the certificate ",
                                                     options.cert));
    }
  }
  return m;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsOptions& options) {
  if (!options.enabled()) return grpc::InsecureServerCredentials();
  if (options.cert.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a server needs its certificate and key (tls cert and key)");
  }
  if (options.mutual && options.ca_cert.empty()) {
    return absl::InvalidArgumentError(
        "TLS: mutual TLS needs the CA certificate that verifies the clients (tls ca_cert)");
  }
  ONEBIT_ASSIGN_OR_RETURN(TlsMaterial m, LoadTlsMaterial(options));
  grpc::SslServerCredentialsOptions ssl(
      options.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                     : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_root_certs = m.ca_pem;
  ssl.pem_key_cert_pairs.push_back({m.key_pem, m.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(
    const TlsOptions& options) {
  if (!options.enabled()) return grpc::InsecureChannelCredentials();
  ONEBIT_ASSIGN_OR_RETURN(TlsMaterial m, LoadTlsMaterial(options));
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = m.ca_pem;
  ssl.pem_private_key = m.key_pem;
  ssl.pem_cert_chain = m.cert_pem;
  return grpc::SslCredentials(ssl);
}

int ConnectTimeoutMs(const TlsOptions& options, int plaintext_ms) {
  constexpr int kTlsConnectTimeoutMs = 5000;
  return options.enabled() ? std::max(plaintext_ms, kTlsConnectTimeoutMs) : plaintext_ms;
}

void AddTlsChannelArguments(const TlsOptions& options, grpc::ChannelArguments* args) {
  if (options.enabled() && !options.server_name.empty()) {
    args->SetSslTargetNameOverride(options.server_name);
  }
}

std::string HandshakeHint(const TlsOptions& options) {
  if (!options.enabled()) return "";
  return absl::StrCat(
      " [TLS is on: if the server is up, the TLS handshake failed; check that this process's "
      "certificate (",
      options.cert.empty() ? std::string("none given") : options.cert,
      ") is signed by a CA the server trusts, and that the CA certificate (",
      options.ca_cert.empty() ? std::string("system roots") : options.ca_cert,
      ") verifies the server's certificate for this address]");
}

}  // namespace onebit::security
