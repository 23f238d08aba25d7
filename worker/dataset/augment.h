// Training-time augmentation of one scene, as MinkowskiEngine users expect
// it: rotation about the vertical axis, scaling, jitter, flips and colour
// jitter. A pure function of (cloud, seed), with seed = AugmentSeed(run
// seed, epoch, sample index): augmentation keeps no random state of its own,
// so the checkpointed (seed, epoch, cursor) reproduce it exactly on resume.
// Torch-free.
#ifndef TRAINSUP_WORKER_DATASET_AUGMENT_H_
#define TRAINSUP_WORKER_DATASET_AUGMENT_H_

#include <cstdint>

#include "worker/data/point_cloud.h"

namespace trainsup::worker {

// What Augment does; the defaults are the training defaults. Geometric
// transforms act about the centre of the cloud's bounding box, in this
// order: rotate, flip, scale, jitter.
struct AugmentOptions {
  // Rotation about the vertical (z) axis by a uniform angle in [0, 2π).
  bool rotate = true;
  // Mirror x, and independently y, each with probability 1/2.
  bool flip = true;
  // One uniform factor in [scale_min, scale_max) for all three axes.
  // scale_min = scale_max = 1 turns scaling off.
  double scale_min = 0.9;
  double scale_max = 1.1;
  // Per-coordinate Gaussian noise of jitter_sigma metres, clipped to
  // ±jitter_clip. jitter_sigma = 0 turns it off.
  double jitter_sigma = 0.005;
  double jitter_clip = 0.02;
  // Colour jitter, only for clouds with 3 feature channels (rgb in [0, 1]):
  // one uniform brightness offset in [-brightness, brightness) added to
  // every channel of every point, plus per-value Gaussian noise of
  // color_noise, the result clamped to [0, 1]. Both 0 turn it off.
  double brightness = 0.1;
  double color_noise = 0.01;
};

// The augmentation seed of dataset sample `index` in `epoch` of a run
// seeded `run_seed`: MixSeed(run_seed, epoch, index) (worker/dataset/random.h).
uint64_t AugmentSeed(uint64_t run_seed, int64_t epoch, int64_t index);

// `cloud` augmented with `seed`: the same inputs give the same output, bit
// for bit. Labels, origin and source are unchanged; each transform draws
// from its own stream, so turning one off does not change the others.
PointCloud Augment(PointCloud cloud, uint64_t seed, const AugmentOptions& options = {});

}  // namespace trainsup::worker

#endif  // TRAINSUP_WORKER_DATASET_AUGMENT_H_
