// ASPRS LAS point clouds (airborne and terrestrial LiDAR).
#ifndef TRAINSUP_WORKER_DATA_LAS_H_
#define TRAINSUP_WORKER_DATA_LAS_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/point_cloud.h"

namespace trainsup::worker {

// Reads an uncompressed LAS 1.0-1.4 file with point data format 0-3
// (records of 20, 28, 26 or 34 bytes; longer records carry extra bytes,
// which are skipped). The point count is the legacy 32-bit one, or the
// 64-bit one of a 1.4 header when that is set. Coordinates are the stored
// int32 × scale + offset, recentred (PointCloud::origin). The label is the
// ASPRS class, the lower 5 bits of the classification byte (0 never
// classified, 1 unclassified, 2 ground, 3-5 vegetation, 6 building, ...),
// unless options.label_file replaces it. Formats 2 and 3 bring rgb
// (uint16 / 65535) as 3 feature channels; formats 0 and 1 have none.
//
// Errors name the file and the problem. InvalidArgument: no "LASF" magic, a
// version other than 1.0-1.4, compressed LAZ, a point format other than
// 0-3. DataLoss: a header shorter than the LAS minimum or than its version
// needs, point data that starts inside the header, a record length shorter
// than the format's, a point count the file size cannot hold (checked
// before anything is allocated), 32- and 64-bit counts that disagree, a
// zero or non-finite scale, a non-finite offset, a label file whose count
// differs from the point count.
absl::StatusOr<PointCloud> ReadLas(const std::string& path, const ReadOptions& options);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATA_LAS_H_
