#include "supervisor/policy/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace trainsup::supervisor {

// getrandom(2) blocks
// only before the pool is first initialized, long before a daemon runs.
std::string SecureRandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  size_t got = 0;
  while (got < raw.size()) {
    const ssize_t n = getrandom(raw.data() + got, raw.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // No CSPRNG means no secrets: refusing to go on is the only safe act.
      std::fprintf(stderr, "getrandom: %s\n", std::strerror(errno));
      std::abort();
    }
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

AuthResult Authenticate(const std::vector<Token>& tokens,
                        const std::optional<std::string>& authorization, TokenRole needed,
                        const std::string& method) {
  AuthResult r;
  if (tokens.empty()) return r;
  if (!authorization) {
    r.status = absl::UnauthenticatedError("missing authorization: Bearer <token>");
    return r;
  }
  const std::string prefix = "Bearer ";
  if (authorization->compare(0, prefix.size(), prefix) != 0) {
    r.status = absl::UnauthenticatedError("authorization must be \"Bearer <token>\"");
    return r;
  }
  const std::string secret = authorization->substr(prefix.size());
  const Token* found = nullptr;
  // Every token is compared: the time does not tell which one matched.
  for (const Token& t : tokens) {
    if (ConstantTimeEquals(t.secret, secret)) found = &t;
  }
  if (found == nullptr) {
    r.status = absl::UnauthenticatedError("unknown token");
    return r;
  }
  r.token_name = found->name;
  if (needed == TokenRole::kOperator && found->role != TokenRole::kOperator) {
    r.status = absl::PermissionDeniedError(absl::StrCat("token \"", found->name, "\" has role ",
                                                        ToString(found->role), "; ", method,
                                                        " needs operator"));
  }
  return r;
}

}  // namespace trainsup::supervisor
