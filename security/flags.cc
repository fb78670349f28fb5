#include "security/flags.h"

#include <optional>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that verifies the peers' certificates (TLS); default: the "
          "job config's onebit.security.tls.ca_cert.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this process's certificate (TLS); default: onebit.security.tls.cert.");
ABSL_FLAG(std::string, tls_key, "",
          "PEM file of this process's private key (TLS); default: onebit.security.tls.key.");
ABSL_FLAG(std::optional<bool>, tls_mutual, std::nullopt,
          "Servers require a client certificate signed by --tls_ca; default: "
          "onebit.security.tls.mutual (true).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Check servers' certificates against this name instead of the dialled host; "
          "default: onebit.security.tls.server_name.");

namespace onebit::security {

TlsOptions TlsFromConfig(const TlsConfig& config) {
  TlsOptions options;
  options.ca_cert = config.ca_cert;
  options.cert = config.cert;
  options.key = config.key;
  options.mutual = config.mutual;
  options.server_name = config.server_name;
  return options;
}

absl::StatusOr<TlsOptions> TlsFromFlags(const TlsConfig& config) {
  TlsOptions options = TlsFromConfig(config);
  auto take = [](const std::string& flag, std::string* field) {
    if (!flag.empty()) *field = flag;
  };
  take(absl::GetFlag(FLAGS_tls_ca), &options.ca_cert);
  take(absl::GetFlag(FLAGS_tls_cert), &options.cert);
  take(absl::GetFlag(FLAGS_tls_key), &options.key);
  take(absl::GetFlag(FLAGS_tls_server_name), &options.server_name);
  if (absl::GetFlag(FLAGS_tls_mutual).has_value()) options.mutual = *absl::GetFlag(FLAGS_tls_mutual);
  if (options.cert.empty() != options.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  return options;
}

}  // namespace onebit::security
