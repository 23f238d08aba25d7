// ParseRunSpec on arbitrary text (the toml_guard in front of toml++, then
// every field's checks), with toml++ compiled in and instrumented.
#include <cstddef>
#include <cstdint>
#include <string>

#include "contracts/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)trainsup::ParseRunSpec(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
