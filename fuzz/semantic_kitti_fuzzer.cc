// ReadSemanticKitti on a scan and its label file cut from one input: the
// first byte is the label file's length in 4-byte labels (0: no label
// file), taken from the end; the rest is the scan.
#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "fuzz/fuzz_util.h"
#include "worker/data/readers.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace trainsup;
  if (size == 0) return 0;
  const size_t labels = std::min<size_t>(size_t{data[0]} * 4, size - 1);
  const std::string dir = fuzz::ScratchDir() + "/sequences/00";
  std::filesystem::create_directories(dir + "/velodyne");
  std::filesystem::create_directories(dir + "/labels");
  const std::string scan = dir + "/velodyne/000000.bin";
  const std::string label = dir + "/labels/000000.label";
  fuzz::WriteFile(scan, data + 1, size - 1 - labels);
  std::error_code ec;
  std::filesystem::remove(label, ec);
  if (data[0] != 0) fuzz::WriteFile(label, data + size - labels, labels);
  absl::StatusOr<worker::PointCloud> cloud = worker::ReadPointCloud(scan, "semantickitti", {});
  if (cloud.ok()) {
    fuzz::Check(cloud->features.size() == cloud->size(), "one remission per point");
    fuzz::Check(cloud->labels.empty() || cloud->labels.size() == cloud->size(), "labels");
  }
  return 0;
}
