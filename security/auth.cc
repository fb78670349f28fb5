#include "security/auth.h"

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace onebit::security {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 4096;

absl::Status CheckToken(absl::string_view token, absl::string_view where) {
  if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a token must have ", kMinTokenLength, " to ", kMaxTokenLength,
        " characters, got ", token.size(), " (make one with: openssl rand -hex 32)"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a token is printable ASCII without spaces"));
    }
  }
  return absl::OkStatus();
}

// The token of "Bearer <token>" (the scheme is case-insensitive, RFC 7235), or "" when
// `authorization` is not of that form.
absl::string_view BearerToken(absl::string_view authorization) {
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return "";
  }
  return absl::StripAsciiWhitespace(authorization.substr(kScheme.size()));
}

}  // namespace

std::string BearerValue(absl::string_view token) { return absl::StrCat("Bearer ", token); }

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // The length is not secret (tokens are long random strings); the contents are.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::Status Authorize(const Tokens& tokens, Access access, absl::string_view authorization,
                       absl::string_view call) {
  const std::string& needed = access == Access::kAdmin ? tokens.admin : tokens.member;
  if (needed.empty()) return absl::OkStatus();
  const char* kind = access == Access::kAdmin ? "the admin token" : "a member or admin token";
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat(call, " needs ", kind, " ('authorization: Bearer <token>'); none was sent"));
  }
  const absl::string_view token = BearerToken(authorization);
  if (token.empty()) {
    return absl::UnauthenticatedError(
        absl::StrCat(call, " needs ", kind, "; the authorization is not 'Bearer <token>'"));
  }
  const bool admin = !tokens.admin.empty() && ConstantTimeEquals(token, tokens.admin);
  const bool member = !tokens.member.empty() && ConstantTimeEquals(token, tokens.member);
  if (admin || (access == Access::kMember && member)) return absl::OkStatus();
  if (member) {
    return absl::PermissionDeniedError(
        absl::StrCat(call, " is an admin call: the member token does not allow it"));
  }
  return absl::UnauthenticatedError(absl::StrCat(call, " needs ", kind, "; the token sent is not valid"));
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the token file ", path));
  std::string text;
  // Read a bounded amount: a token file is small.
  text.resize(kMaxTokenLength + 64);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  const std::string token(absl::StripAsciiWhitespace(text));
  if (absl::Status s = CheckToken(token, absl::StrCat("the token file ", path)); !s.ok()) return s;
  return token;
}

absl::StatusOr<std::string> ResolveToken(const std::string& flag_file, const char* env_var,
                                         const std::string& config_file) {
  if (!flag_file.empty()) return ReadTokenFile(flag_file);
  const char* env = env_var != nullptr ? std::getenv(env_var) : nullptr;
  if (env != nullptr && *env != '\0') {
    const std::string token(absl::StripAsciiWhitespace(env));
    if (absl::Status s = CheckToken(token, absl::StrCat("$", env_var)); !s.ok()) return s;
    return token;
  }
  if (!config_file.empty()) return ReadTokenFile(config_file);
  return std::string();
}

}  // namespace onebit::security
