// safetensors files: an 8-byte little-endian header length, a JSON header
// ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}),
// then the raw little-endian tensor bytes. Python's `safetensors` and other
// readers open them without trainsup. LibTorch part of checkpoint/.
#ifndef TRAINSUP_CHECKPOINT_SAFETENSORS_H_
#define TRAINSUP_CHECKPOINT_SAFETENSORS_H_

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/file_system.h"
#include "checkpoint/store.h"

namespace trainsup::ckpt {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Streams a safetensors file to `sink`. Tensors must be on the CPU (any
// layout; they are written contiguous). Names must be unique.
absl::Status WriteSafetensors(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata,
                              const ByteSink& sink);

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads and validates a safetensors file (header bounds, offsets inside the
// data, sizes matching shape and dtype). DataLoss naming the problem, also
// for a missing or short file; Unavailable for any other read failure (an
// I/O error: CheckpointReadError); ResourceExhausted when a tensor cannot be
// allocated.
absl::StatusOr<SafetensorsFile> ReadSafetensors(FileSystem* fs, const std::string& path);

}  // namespace trainsup::ckpt

#endif  // TRAINSUP_CHECKPOINT_SAFETENSORS_H_
