// The choice of the cpu backend's bf16 convolution kernels (kernels.h):
// whether the CPU has them, the mode, the measured speed that decides, and
// the line that says which runs. The kernels are in kernels.cc (drivers)
// and kernels_avx512.cc and kernels_amx.cc (tiles).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "c10/util/Exception.h"
#include "sparse/cpu/kernels.h"
#include "sparse/cpu/kernels_fused.h"

namespace trainsup::sparse::cpu {

bool Bf16KernelsSupported() { return fused::Avx512Bf16Supported() && fused::Avx512Supported(); }

Bf16Mode Bf16ModeFromString(const char* value, const char* variable) {
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "auto") return Bf16Mode::kMeasured;
  if (v == "1") return Bf16Mode::kOn;
  if (v == "0") return Bf16Mode::kOff;
  TORCH_CHECK(false, variable, ": unknown value '", v, "' (expected 1, 0 or auto)");
}

namespace {
std::atomic<Bf16Mode>& Bf16ModeFlag() {
  static std::atomic<Bf16Mode> flag{Bf16ModeFromString(std::getenv("TRAINSUP_BF16_KERNELS"))};
  return flag;
}
std::atomic<Bf16Mode>& AmxModeFlag() {
  static std::atomic<Bf16Mode> flag{
      Bf16ModeFromString(std::getenv("TRAINSUP_AMX"), "TRAINSUP_AMX")};
  return flag;
}
// What a mode decides without measuring: on or off; nullopt: measure.
std::optional<bool> Forced(const std::atomic<Bf16Mode>& flag) {
  switch (flag.load(std::memory_order_relaxed)) {
    case Bf16Mode::kOn:
      return true;
    case Bf16Mode::kOff:
      return false;
    case Bf16Mode::kMeasured:
      break;
  }
  return std::nullopt;
}
std::atomic<const fused::Bf16TileKernels*>& TilesOverride() {
  static std::atomic<const fused::Bf16TileKernels*> tiles{nullptr};
  return tiles;
}
// AMX tiles this process may use: the CPU has them and they agree with the
// emulation (checked once).
bool AmxUsable() {
  static const bool usable = fused::AmxBf16Supported() && fused::AmxAgreesWithEmulation();
  return usable;
}
}  // namespace

Bf16Mode SetBf16Mode(Bf16Mode mode) { return Bf16ModeFlag().exchange(mode); }
Bf16Mode SetAmxMode(Bf16Mode mode) { return AmxModeFlag().exchange(mode); }

double Bf16DotSpeed() {
  static const double speed = Bf16KernelsSupported() ? fused::MeasureBf16DotOverFma() : 0.0;
  return speed;
}

double AmxSpeed() {
  static const double speed = AmxUsable() ? fused::MeasureAmxOverFloat32Tiles() : 0.0;
  return speed;
}

bool AmxTilesActive() {
  if (TilesOverride().load() != nullptr) return false;
  // Off: no AMX instruction runs, not even the agreement check.
  const std::optional<bool> forced = Forced(AmxModeFlag());
  if (forced == false || !AmxUsable()) return false;
  return forced == true || AmxSpeed() >= kBf16MinSpeed;
}

bool Bf16KernelsActive() {
  if (TilesOverride().load() != nullptr) return true;
  if (!Bf16KernelsSupported() || ActiveKernelSet() != KernelSet::kAvx512) return false;
  if (const std::optional<bool> forced = Forced(Bf16ModeFlag())) return *forced;
  return AmxTilesActive() || Bf16DotSpeed() >= kBf16MinSpeed;
}

namespace fused {

const Bf16TileKernels* SetBf16TilesOverride(const Bf16TileKernels* tiles) {
  return TilesOverride().exchange(tiles);
}

const Bf16TileKernels& ActiveBf16Tiles() {
  if (const Bf16TileKernels* tiles = TilesOverride().load()) return *tiles;
  return AmxTilesActive() ? AmxBf16TileKernels() : Avx512Bf16TileKernels();
}

}  // namespace fused

std::string DescribeBf16Kernels() {
  if (const fused::Bf16TileKernels* tiles = TilesOverride().load()) {
    return std::string(" with ") + tiles->name + " (a test's override)";
  }
  if (!Bf16KernelsSupported()) return "";
  // Why the AMX tiles are not the ones, where the CPU has them.
  std::string amx;
  if (fused::CpuHasAmxBf16() && !AmxTilesActive()) {
    if (AmxModeFlag().load() == Bf16Mode::kOff) {
      amx = " (AMX_BF16 turned off)";
    } else if (!fused::AmxBf16Supported()) {
      amx = " (AMX_BF16 unused: Linux did not grant this process its state)";
    } else if (!AmxUsable()) {
      amx = " (AMX_BF16 unused: its results disagree with the emulated instructions here)";
    } else {
      char line[112];
      std::snprintf(line, sizeof line,
                    " (AMX_BF16 unused: its convolution tiles run at %.2fx the float32 ones here)",
                    AmxSpeed());
      amx = line;
    }
  }
  if (Bf16KernelsActive()) {
    return std::string(" with ") + fused::ActiveBf16Tiles().name + amx;
  }
  if (ActiveKernelSet() != KernelSet::kAvx512) return " (AVX512_BF16 unused: not the avx512 set)";
  if (Bf16ModeFlag().load() == Bf16Mode::kOff) return " (AVX512_BF16 turned off)";
  char line[112];
  std::snprintf(line, sizeof line,
                " (AVX512_BF16 unused: its dot products run at %.2fx the float32 FMA rate here)",
                Bf16DotSpeed());
  return line + amx;
}

}  // namespace trainsup::sparse::cpu
