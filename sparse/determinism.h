// The process-wide deterministic switch. With it on, every op of the engine
// gives results that do not depend on the row order of its input, bit for
// bit: kernel maps are built in the coordinates' key order and reductions
// over rows (BatchNorm statistics, global pooling, weight gradients) run in
// that order too. It costs a sort per coordinate set that is not in key
// order already (quantize() and Downsample() produce sorted sets).
#ifndef TRAINSUP_SPARSE_DETERMINISM_H_
#define TRAINSUP_SPARSE_DETERMINISM_H_

namespace trainsup::sparse {

void SetDeterministic(bool on);
bool IsDeterministic();

// Sets the switch for one scope and restores the previous value after.
class DeterministicGuard {
 public:
  explicit DeterministicGuard(bool on) : previous_(IsDeterministic()) { SetDeterministic(on); }
  ~DeterministicGuard() { SetDeterministic(previous_); }
  DeterministicGuard(const DeterministicGuard&) = delete;
  DeterministicGuard& operator=(const DeterministicGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_DETERMINISM_H_
