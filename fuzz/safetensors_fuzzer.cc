// ReadSafetensors on an arbitrary file; what it reads must write back and
// read again to the same names, dtypes, shapes and bytes.
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "checkpoint/safetensors.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  ckpt::FileSystem* fs = ckpt::FileSystem::Default();
  const std::string path = fuzz::WriteScratchFile("model.safetensors", data, size);
  absl::StatusOr<ckpt::SafetensorsFile> file = ckpt::ReadSafetensors(fs, path);
  if (!file.ok()) return 0;
  ckpt::NamedTensors tensors(file->tensors.begin(), file->tensors.end());
  std::string bytes;
  absl::Status written = ckpt::WriteSafetensors(tensors, file->metadata, [&](std::string_view s) {
    bytes.append(s);
    return absl::OkStatus();
  });
  fuzz::Check(written.ok(), "what was read writes back");
  const std::string copy = fuzz::WriteScratchFile(
      "copy.safetensors", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  absl::StatusOr<ckpt::SafetensorsFile> again = ckpt::ReadSafetensors(fs, copy);
  fuzz::Check(again.ok(), "what was written reads back");
  fuzz::Check(again->metadata == file->metadata, "metadata");
  fuzz::Check(again->tensors.size() == file->tensors.size(), "tensor count");
  for (const auto& [name, tensor] : file->tensors) {
    const auto it = again->tensors.find(name);
    fuzz::Check(it != again->tensors.end(), "tensor names");
    fuzz::Check(it->second.scalar_type() == tensor.scalar_type(), "dtype");
    fuzz::Check(it->second.sizes() == tensor.sizes(), "shape");
    const size_t n = static_cast<size_t>(tensor.numel()) * tensor.element_size();
    fuzz::Check(n == 0 || std::memcmp(it->second.data_ptr(), tensor.data_ptr(), n) == 0, "bytes");
  }
  return 0;
}
