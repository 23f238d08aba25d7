// SemanticKITTI scans (velodyne .bin with an optional .label).
#ifndef TRAINSUP_WORKER_DATA_SEMANTIC_KITTI_H_
#define TRAINSUP_WORKER_DATA_SEMANTIC_KITTI_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/point_cloud.h"

namespace trainsup::worker {

// Reads a SemanticKITTI scan: `path` holds float32 x y z remission per point
// (little-endian, 16 bytes a point); the remission is the one feature
// channel. Labels come from options.kitti_label_file, or else from the
// dataset layout's sibling file (KittiLabelPath) when it exists: uint32 per
// point, the semantic class in the lower 16 bits (the upper 16, the
// instance id, are dropped). The classes are the raw SemanticKITTI ids
// (0 unlabeled, 10 car, ..., 259); mapping them to training classes is the
// dataset's business. options.label_file, when set, replaces them.
//
// Errors name the file and the problem, all DataLoss: a scan size that is
// not a multiple of 16, a label file size that is not a multiple of 4 or
// whose count differs from the scan's, a non-finite coordinate or
// remission. A named label file that does not exist is NotFound.
absl::StatusOr<PointCloud> ReadSemanticKitti(const std::string& path, const ReadOptions& options);

// Where the layout keeps the labels of scan `path`:
// sequences/SS/velodyne/NNNNNN.bin → sequences/SS/labels/NNNNNN.label; for a
// scan outside a velodyne/ folder, NNNNNN.label beside it.
std::string KittiLabelPath(const std::string& path);

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATA_SEMANTIC_KITTI_H_
