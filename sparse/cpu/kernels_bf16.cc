// The choice of the cpu backend's bf16 convolution kernels (kernels.h):
// whether the CPU has them, the mode, the measured speed that decides, and
// the line that says which runs. The kernels are in kernels.cc (drivers)
// and kernels_avx512.cc (tiles).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "c10/util/Exception.h"
#include "sparse/cpu/kernels.h"
#include "sparse/cpu/kernels_fused.h"

namespace trainsup::sparse::cpu {

bool Bf16KernelsSupported() { return fused::Avx512Bf16Supported() && fused::Avx512Supported(); }

Bf16Mode Bf16ModeFromString(const char* value) {
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "auto") return Bf16Mode::kMeasured;
  if (v == "1") return Bf16Mode::kOn;
  if (v == "0") return Bf16Mode::kOff;
  TORCH_CHECK(false, "TRAINSUP_BF16_KERNELS: unknown value '", v, "' (expected 1, 0 or auto)");
}

namespace {
std::atomic<Bf16Mode>& Bf16ModeFlag() {
  static std::atomic<Bf16Mode> flag{Bf16ModeFromString(std::getenv("TRAINSUP_BF16_KERNELS"))};
  return flag;
}
}  // namespace

Bf16Mode SetBf16Mode(Bf16Mode mode) { return Bf16ModeFlag().exchange(mode); }

double Bf16DotSpeed() {
  static const double speed = Bf16KernelsSupported() ? fused::MeasureBf16DotOverFma() : 0.0;
  return speed;
}

bool Bf16KernelsActive() {
  if (!Bf16KernelsSupported() || ActiveKernelSet() != KernelSet::kAvx512) return false;
  switch (Bf16ModeFlag().load(std::memory_order_relaxed)) {
    case Bf16Mode::kOn:
      return true;
    case Bf16Mode::kOff:
      return false;
    case Bf16Mode::kMeasured:
      break;
  }
  return Bf16DotSpeed() >= kBf16MinSpeed;
}

std::string DescribeBf16Kernels() {
  if (!Bf16KernelsSupported()) return "";
  if (Bf16KernelsActive()) return " with AVX512_BF16";
  if (ActiveKernelSet() != KernelSet::kAvx512) return " (AVX512_BF16 unused: not the avx512 set)";
  if (Bf16ModeFlag().load() == Bf16Mode::kOff) return " (AVX512_BF16 turned off)";
  char line[112];
  std::snprintf(line, sizeof line,
                " (AVX512_BF16 unused: its dot products run at %.2fx the float32 FMA rate here)",
                Bf16DotSpeed());
  return line;
}

}  // namespace trainsup::sparse::cpu
