// Straggler detection (distributed.straggler_factor, docs/distributed.md):
// which rank of a gang computes its steps much slower than the others. In
// a synchronous data-parallel gang every rank runs at the pace of the
// slowest, so step rates are equal; what differs is the time each spends
// outside the collectives (computing, not waiting for its peers), which
// the workers report with each heartbeat (Progress.step_compute_seconds).
// A function of data: fed samples with their times, asked for verdicts.
#ifndef TRAINSUP_SUPERVISOR_POLICY_STRAGGLER_H_
#define TRAINSUP_SUPERVISOR_POLICY_STRAGGLER_H_

#include <deque>
#include <map>
#include <utility>
#include <vector>

namespace trainsup::supervisor {

class StragglerDetector {
 public:
  // factor > 1: a rank is a straggler while the median of its samples over
  // the last `window_s` seconds is above `factor` times the median of the
  // other ranks' medians. The other ranks, not the whole gang: with two
  // ranks the gang's median is the mean of both, which a rank can never
  // exceed by a factor of 2 or more.
  StragglerDetector(double factor, double window_s);

  // A step's compute seconds of `rank` at `now_s`; samples older than the
  // window are forgotten. Negative or non-finite samples are ignored.
  void Observe(int rank, double now_s, double compute_s);
  // The rank is gone (its attempt ended): its samples and verdict too.
  void Forget(int rank);

  struct Change {
    int rank = 0;
    bool straggler = false;  // became one (true) or stopped being one
    double median_s = 0;     // the rank's windowed median
    double others_s = 0;     // the other ranks' median
  };
  // Judges every rank at `now_s` and returns those whose verdict changed.
  // A rank is judged only once its samples span the whole window (it has
  // been observed for window_s) and at least two other ranks' or, in a
  // gang of two, the other's samples exist; until then it keeps its verdict.
  std::vector<Change> Judge(double now_s);

  bool straggler(int rank) const;
  // The rank's windowed median at the last Judge (0 before one, or without
  // samples), and its ratio to the others' median while it is a straggler
  // (0 otherwise).
  double median_s(int rank) const;
  double ratio(int rank) const;

 private:
  struct Rank {
    std::deque<std::pair<double, double>> samples;  // (time, seconds), oldest first
    double first_s = -1;                            // when first observed
    double median = 0;                              // of the samples, at the last Judge
    bool straggler = false;
    double ratio = 0;
  };
  void Trim(Rank& r, double now_s) const;

  double factor_;
  double window_s_;
  std::map<int, Rank> ranks_;
};

}  // namespace trainsup::supervisor

#endif  // TRAINSUP_SUPERVISOR_POLICY_STRAGGLER_H_
