// What the fuzz targets share: a scratch directory for the parsers that read
// files (on tmpfs when there is one), and a check that aborts, so a broken
// property is a crash that libFuzzer reports and minimizes.
#ifndef TRAINSUP_FUZZ_FUZZ_UTIL_H_
#define TRAINSUP_FUZZ_FUZZ_UTIL_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace trainsup::fuzz {

// Aborts with `what` when `ok` is false.
inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what);
    std::abort();
  }
}

// This process's scratch directory, made on first use and removed at exit.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string pattern = base + "/trainsup-fuzz.XXXXXX";
    Check(mkdtemp(pattern.data()) != nullptr, "mkdtemp");
    auto* path = new std::string(pattern);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return path;
  }();
  return *dir;
}

// Writes `size` bytes to `path` (replacing it).
inline void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  Check(static_cast<bool>(out), "write scratch file");
}

// Writes the bytes to ScratchDir()/name and returns the path.
inline std::string WriteScratchFile(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = ScratchDir() + "/" + name;
  WriteFile(path, data, size);
  return path;
}

}  // namespace trainsup::fuzz

#endif  // TRAINSUP_FUZZ_FUZZ_UTIL_H_
