#include "contracts/version.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

#ifndef TRAINSUP_VERSION
#error "TRAINSUP_VERSION must be defined (contracts/CMakeLists.txt, from the file VERSION)"
#endif

namespace trainsup {
namespace {

struct Semver {
  uint32_t major = 0;
  uint32_t minor = 0;
  uint32_t patch = 0;
};

std::optional<Semver> Parse(absl::string_view text) {
  // The pre-release or build suffix does not decide compatibility.
  const size_t suffix = text.find_first_of("-+");
  if (suffix != absl::string_view::npos) {
    if (suffix + 1 == text.size()) return std::nullopt;  // an empty suffix
    text = text.substr(0, suffix);
  }
  std::vector<absl::string_view> parts = absl::StrSplit(text, '.');
  if (parts.size() != 3) return std::nullopt;
  uint32_t numbers[3];
  for (int i = 0; i < 3; ++i) {
    const absl::string_view p = parts[i];
    if (p.empty() || p.size() > 9 || p.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(p, &numbers[i])) {
      return std::nullopt;
    }
  }
  return Semver{numbers[0], numbers[1], numbers[2]};
}

}  // namespace

absl::string_view Version() { return TRAINSUP_VERSION; }

absl::Status CheckPeerVersion(absl::string_view daemon, absl::string_view peer) {
  const std::optional<Semver> d = Parse(daemon);
  if (!d) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainsupd has no valid version (\"", daemon, "\")"));
  }
  const std::string serves =
      d->major == 0 ? absl::StrCat("0.", d->minor, ".x") : absl::StrCat(d->major, ".x.y");
  const std::string remedy = absl::StrCat(
      "; use a trainsup-worker or Python client of version ", serves,
      " (deploy/build-worker.sh builds the worker from the daemon's sources, pip install the "
      "client from them)");
  const std::optional<Semver> p = Parse(peer);
  if (peer.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the worker sent no version (older than trainsup 0.1.0); trainsupd ", daemon,
                     " serves ", serves, remedy));
  }
  if (!p) {
    return absl::FailedPreconditionError(absl::StrCat("the worker's version \"", peer,
                                                      "\" is not MAJOR.MINOR.PATCH; trainsupd ",
                                                      daemon, " serves ", serves, remedy));
  }
  if (p->major != d->major || (d->major == 0 && p->minor != d->minor)) {
    return absl::FailedPreconditionError(absl::StrCat("worker version ", peer,
                                                      " cannot be served by trainsupd ", daemon,
                                                      ", which serves ", serves, remedy));
  }
  return absl::OkStatus();
}

}  // namespace trainsup
