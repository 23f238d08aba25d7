// Every point-cloud reader behind one call, chosen by format name. Torch-
// free: plain C++17 with absl::Status, so the data path builds and is tested
// without LibTorch.
#ifndef TRAINSUP_WORKER_DATA_READERS_H_
#define TRAINSUP_WORKER_DATA_READERS_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/las.h"
#include "worker/data/ply.h"
#include "worker/data/point_cloud.h"
#include "worker/data/s3dis.h"
#include "worker/data/semantic_kitti.h"

namespace trainsup::worker {

// Reads `path` with the reader for `format` (ReadPly, ReadLas,
// ReadSemanticKitti, ReadS3dis; see their contracts). The whole file is read
// with one read(2) loop and parsed in memory; no reader allocates more than
// a small multiple of the file's size, whatever its header claims.
//
// Errors carry the file's name and the problem: InvalidArgument for a file
// that is not the format or uses an unsupported feature (and an unknown
// format name), DataLoss for a damaged file, NotFound for a missing one.
absl::StatusOr<PointCloud> ReadPointCloud(const std::string& path, PointCloudFormat format,
                                          const ReadOptions& options);
// The same with the format by name ("ply", "las", "semantickitti", "s3dis").
absl::StatusOr<PointCloud> ReadPointCloud(const std::string& path, const std::string& format,
                                          const ReadOptions& options);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATA_READERS_H_
