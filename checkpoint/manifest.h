// MANIFEST.json of a checkpoint: format version, step, creation time, and
// every file with its size and XXH3-128 hash. Torch-free.
#ifndef TRAINSUP_CHECKPOINT_MANIFEST_H_
#define TRAINSUP_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace trainsup::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr char kManifestName[] = "MANIFEST.json";

struct ManifestEntry {
  std::string name;  // file name inside the checkpoint directory
  uint64_t size = 0;
  std::string xxh3_128;  // 32 lower-case hex digits
};

struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;
  std::string created;  // UTC, RFC 3339
  std::vector<ManifestEntry> files;

  std::string ToJson() const;
  // Parses and checks the structure (not the files). InvalidArgument
  // ("DataLoss" for the caller) naming what is wrong and the field. Numbers
  // are read in full width and range-checked, never narrowed:
  // format_version 1..2^31-1, step 0..2^63-1, size 0..2^64-1; xxh3_128 is
  // 32 lower-case hex digits.
  static absl::StatusOr<Manifest> FromJson(std::string_view json);
};

// Incremental XXH3-128 over a stream of pieces.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(std::string_view data);
  // 32 lower-case hex digits (canonical, most significant first).
  std::string HexDigest() const;

 private:
  void* state_;
};

std::string NowRfc3339();

}  // namespace trainsup::ckpt

#endif  // TRAINSUP_CHECKPOINT_MANIFEST_H_
