// ReadExitFile on an arbitrary file; what it reads is in range and writes
// back (through the atomic write) to a file that reads the same.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/file_system.h"
#include "contracts/exit_file.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  const std::string path = fuzz::WriteScratchFile("rank-0.exit.json", data, size);
  absl::StatusOr<ExitFile> f = ReadExitFile(path);
  if (!f.ok()) return 0;
  fuzz::Check(f->code >= 0 && f->code <= 255, "code in 0..255");
  fuzz::Check(f->last_step >= -1 && f->time_ms >= 0, "last_step and time_ms in range");
  const std::string run_dir = fuzz::ScratchDir() + "/run";
  fuzz::Check(WriteExitFile(ckpt::FileSystem::Default(), run_dir, 1, 0, *f).ok(), "writes back");
  absl::StatusOr<ExitFile> again = ReadExitFile(ExitFilePath(run_dir, 1, 0));
  fuzz::Check(again.ok(), "reads back");
  fuzz::Check(again->code == f->code && again->reason == f->reason &&
                  again->message == f->message && again->last_step == f->last_step &&
                  again->time_ms == f->time_ms,
              "the round trip is exact");
  return 0;
}
