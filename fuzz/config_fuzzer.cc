// ParseConfig on arbitrary text; what it accepts must format to a file that
// parses again (from another base directory) to the same file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "contracts/daemon_config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  absl::StatusOr<supervisor::DaemonConfig> config =
      supervisor::ParseConfig(std::string(reinterpret_cast<const char*>(data), size), "/base");
  if (!config.ok()) return 0;
  const std::string formatted = supervisor::FormatConfig(*config);
  absl::StatusOr<supervisor::DaemonConfig> again = supervisor::ParseConfig(formatted, "/other");
  fuzz::Check(again.ok(), "a formatted config parses");
  fuzz::Check(supervisor::FormatConfig(*again) == formatted, "the format round trip is exact");
  return 0;
}
