// The data roots: the directories a run's data may come from (the daemon's
// `data_roots`). trainsupd checks the spec's top-level paths at submit
// (CheckSpecPaths in spec.h) and passes its roots to every worker it starts
// in TRAINSUP_DATA_ROOTS; the worker confines every data file and folder it
// opens to them, at every attempt, after every symlink (worker/data).
#ifndef TRAINSUP_CONTRACTS_DATA_ROOTS_H_
#define TRAINSUP_CONTRACTS_DATA_ROOTS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace trainsup {

// The environment variable: absolute paths joined by ':'. Unset means no
// confinement (a user running the worker by hand); set but empty means no
// root, so no data file may be read.
inline constexpr char kDataRootsEnv[] = "TRAINSUP_DATA_ROOTS";

// The variable's value for `roots`. InvalidArgument naming the root when one
// is not absolute or contains ':'.
absl::StatusOr<std::string> FormatDataRoots(const std::vector<std::string>& roots);

// Parses the variable's value; `value` null (unset) gives nullopt.
// InvalidArgument ("TRAINSUP_DATA_ROOTS: ...") for an entry that is not an
// absolute path; empty entries are skipped.
absl::StatusOr<std::optional<std::vector<std::string>>> ParseDataRoots(const char* value);

// Whether `path` lies inside one of `roots` once both are resolved
// (std::filesystem::weakly_canonical: every symlink of the part that exists
// followed), comparing whole components: "/data" holds "/data" and
// "/data/a", not "/database". A root that cannot be resolved holds nothing.
bool PathInsideRoots(const std::string& path, const std::vector<std::string>& roots);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_DATA_ROOTS_H_
