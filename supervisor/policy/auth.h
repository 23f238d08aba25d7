// Authenticating an API call, as a pure function of the configured tokens
// and the call's `authorization` metadata. The gRPC service calls it before
// it looks at the request at all.
#ifndef TRAINSUP_SUPERVISOR_POLICY_AUTH_H_
#define TRAINSUP_SUPERVISOR_POLICY_AUTH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "contracts/daemon_config.h"

namespace trainsup::supervisor {

struct AuthResult {
  // OK, Unauthenticated (no, malformed or unknown token) or PermissionDenied
  // (a viewer token for an operator method), with the reason.
  absl::Status status;
  // The token's name when one matched ("" when none is configured: the
  // socket's permissions are then all that guards it).
  std::string token_name;
};

// `authorization` is the call's metadata value, if any: "Bearer <secret>".
// With no tokens configured every call is allowed (only possible on the
// unix socket: config validation refuses TCP without tokens). Secrets are
// compared in constant time.
AuthResult Authenticate(const std::vector<Token>& tokens,
                        const std::optional<std::string>& authorization, TokenRole needed,
                        const std::string& method);

// `bytes` bytes from the kernel's CSPRNG (getrandom(2)), hex-encoded: worker
// tokens and run-id suffixes, so that no output reveals a generator's state.
// Aborts the process if the kernel has no CSPRNG to give.
std::string SecureRandomHex(int bytes);

// Compares two strings in time that depends on their lengths only.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_AUTH_H_
