// The project's version and which versions of each other its parts accept.
// There is one version number, the file VERSION at the top of the source
// tree: CMake compiles it into this library, the Debian package and the
// Python client's build read the same file. trainsupd, trainctl and
// trainsup-worker print it with --version, GetNode reports the daemon's,
// and every worker and Python client sends its own in the worker channel's
// Hello.
#ifndef TRAINSUP_CONTRACTS_VERSION_H_
#define TRAINSUP_CONTRACTS_VERSION_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainsup {

// This build's version, e.g. "0.1.0".
absl::string_view Version();

// Whether a daemon of version `daemon` serves a worker or Python client of
// version `peer` on the worker channel. Semantic versioning: the same major
// version, and while the major version is 0 also the same minor version
// (a 0.y release may change the worker channel); patch releases mix freely.
// A version is MAJOR.MINOR.PATCH in decimal, optionally followed by
// "-something" or "+something", which is ignored here.
//
// OK when served. FailedPrecondition otherwise, with a message that names
// both versions, the versions the daemon serves and what to do; an empty
// `peer` (a client from before versions were sent) or a malformed one is
// refused the same way.
absl::Status CheckPeerVersion(absl::string_view daemon, absl::string_view peer);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_VERSION_H_
