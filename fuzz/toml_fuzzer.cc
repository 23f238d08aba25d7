// The guard in front of toml++ 3.3.0 (contracts/toml_guard.h): whatever it lets
// through, toml++ (compiled in, under UBSan) must parse or reject without
// undefined behaviour. Without the guard a bare U+00E9 reaches
// TOML_UNREACHABLE (run with TRAINSUP_FUZZ_NO_GUARD=1 to see it).
#include <toml++/toml.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "contracts/toml_guard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool guarded = std::getenv("TRAINSUP_FUZZ_NO_GUARD") == nullptr;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (guarded && !trainsup::CheckTomlCharacters(absl::string_view(text.data(), text.size())).ok()) {
    return 0;
  }
  try {
    (void)toml::parse(text);
  } catch (const toml::parse_error&) {
  }
  return 0;
}
