// Bearer tokens for the coordinator's calls (gRPC metadata and REST headers alike:
// "authorization: Bearer <token>").
//
// Two tokens, both optional, each a secret shared through a file or an environment
// variable (never a command-line flag: argv is visible to every user in ps):
//   admin token   the admin calls, which change the job: Freeze, DelayFreeze, Stop,
//                 Checkpoint. Not configured: admin calls are open to whoever the
//                 transport lets in (with mutual TLS, holders of a certificate of the
//                 job's CA), as before.
//   member token  the calls of the job's own processes (Register, KvSet/KvGet, Lease,
//                 ReportStats, ReportFailure, Session, CommitPart) and the read-only
//                 calls (GetJob, ListMembers, ListCheckpoints). Not configured: open to
//                 whoever the transport lets in. The admin token is accepted wherever
//                 the member token is (an operator may read, and could stop the job
//                 anyway).
// A missing, malformed or unknown token is UNAUTHENTICATED; the member token on an admin
// call is PERMISSION_DENIED (a known caller without the right).
//
// Thread safety: free functions, no state.
#ifndef ONEBIT_SECURITY_AUTH_H_
#define ONEBIT_SECURITY_AUTH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace onebit::security {

// "" means not configured.
struct Tokens {
  std::string admin;
  std::string member;
};

enum class Access {
  kMember,  // a process of the job, or a read-only call
  kAdmin,   // changes the job
};

// The header/metadata key (gRPC metadata keys are lowercase) and its value for `token`.
inline constexpr char kAuthorizationKey[] = "authorization";
std::string BearerValue(absl::string_view token);

// OK when `authorization` (the header's value, "" when absent) grants `access` under
// `tokens`; UNAUTHENTICATED or PERMISSION_DENIED otherwise, with a message that names
// `call` and never the token.
absl::Status Authorize(const Tokens& tokens, Access access, absl::string_view authorization,
                       absl::string_view call);

// Compares without an early exit, so that the time taken says nothing about the token.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// A token from a file: its contents without surrounding whitespace. INVALID_ARGUMENT if it
// is shorter than 16 characters or holds anything but printable ASCII without spaces
// (it travels in a header); NOT_FOUND if the file cannot be read.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The token of a process: from `flag_file` if set, else the environment variable
// `env_var` if set and not empty, else `config_file` if set, else "" (none). The same
// checks as ReadTokenFile; errors say where the token came from.
absl::StatusOr<std::string> ResolveToken(const std::string& flag_file, const char* env_var,
                                         const std::string& config_file);

}  // namespace onebit::security

#endif  // ONEBIT_SECURITY_AUTH_H_
