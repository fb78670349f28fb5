// The TLS flags every onebit binary shares, over the job config's onebit.security.tls:
//   --tls_ca=PEM --tls_cert=PEM --tls_key=PEM [--tls_mutual=true|false] [--tls_server_name=NAME]
// A flag that is given wins over the config's key; the rest come from the config. Linking
// this library defines the flags.
#ifndef ONEBIT_SECURITY_FLAGS_H_
#define ONEBIT_SECURITY_FLAGS_H_

#include "absl/status/statusor.h"
#include "config/job_config.h"
#include "security/tls.h"

namespace onebit::security {

// The config's TLS block as options.
TlsOptions TlsFromConfig(const TlsConfig& config);

// The config's block with the --tls_* flags applied. INVALID_ARGUMENT for a cert without
// its key (or the reverse).
absl::StatusOr<TlsOptions> TlsFromFlags(const TlsConfig& config = TlsConfig());

}  // namespace onebit::security

#endif  // ONEBIT_SECURITY_FLAGS_H_
