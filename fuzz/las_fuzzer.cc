// ReadLas on arbitrary bytes.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "worker/data/readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  const std::string path = fuzz::WriteScratchFile("cloud.las", data, size);
  absl::StatusOr<worker::PointCloud> cloud = worker::ReadPointCloud(path, "las", {});
  if (cloud.ok()) {
    fuzz::Check(cloud->features.size() == cloud->size() * cloud->feature_channels, "features");
    fuzz::Check(cloud->labels.size() == cloud->size(), "labels");
  }
  return 0;
}
