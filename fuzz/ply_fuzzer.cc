// ReadPly on arbitrary bytes, with the label taken from the file, then
// from a named property that may not exist.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "worker/data/readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  const std::string path = fuzz::WriteScratchFile("cloud.ply", data, size);
  worker::ReadOptions options;
  absl::StatusOr<worker::PointCloud> cloud = worker::ReadPointCloud(path, "ply", options);
  if (cloud.ok()) {
    fuzz::Check(cloud->features.size() == cloud->size() * cloud->feature_channels, "features");
    fuzz::Check(cloud->labels.empty() || cloud->labels.size() == cloud->size(), "labels");
  }
  options.label_property = "class";
  (void)worker::ReadPointCloud(path, "ply", options);
  return 0;
}
