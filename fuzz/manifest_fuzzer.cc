// Manifest::FromJson on arbitrary text; what it accepts must survive
// ToJson and FromJson again unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "checkpoint/manifest.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  absl::StatusOr<ckpt::Manifest> m =
      ckpt::Manifest::FromJson(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!m.ok()) return 0;
  fuzz::Check(m->format_version >= 1 && m->step >= 0, "numbers in range");
  const std::string json = m->ToJson();
  absl::StatusOr<ckpt::Manifest> again = ckpt::Manifest::FromJson(json);
  fuzz::Check(again.ok(), "what FromJson accepts, ToJson writes readably");
  fuzz::Check(again->ToJson() == json, "the round trip is exact");
  return 0;
}
