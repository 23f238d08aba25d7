// Integer voxel coordinates packed into 64-bit keys, and the open-addressing
// hash map from keys to rows that every coordinate set owns. Torch-free.
#ifndef TRAINSUP_SPARSE_COORDINATES_H_
#define TRAINSUP_SPARSE_COORDINATES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace trainsup::sparse {

// A coordinate is (batch, x, y, z). Spatial values are signed and must lie in
// [kMinCoordinate, kMaxCoordinate]; the batch index in [0, kMaxBatchIndex].
// The key orders coordinates lexicographically by (batch, x, y, z).
inline constexpr int kCoordinateBits = 18;
inline constexpr int32_t kMinCoordinate = -(1 << (kCoordinateBits - 1));
inline constexpr int32_t kMaxCoordinate = (1 << (kCoordinateBits - 1)) - 1;
inline constexpr int kBatchBits = 64 - 3 * kCoordinateBits;  // 10
// The all-ones key marks an empty hash slot, so the last batch index is
// reserved.
inline constexpr int32_t kMaxBatchIndex = (1 << kBatchBits) - 2;
inline constexpr uint64_t kEmptyKey = ~uint64_t{0};

inline bool InRange(int32_t v) { return v >= kMinCoordinate && v <= kMaxCoordinate; }
inline bool BatchInRange(int32_t b) { return b >= 0 && b <= kMaxBatchIndex; }

// Packs a coordinate whose values are in range (checked by the caller).
inline uint64_t PackKey(int32_t b, int32_t x, int32_t y, int32_t z) {
  constexpr uint64_t kMask = (uint64_t{1} << kCoordinateBits) - 1;
  constexpr int32_t kBias = -kMinCoordinate;
  return (static_cast<uint64_t>(b) << (3 * kCoordinateBits)) |
         ((static_cast<uint64_t>(x + kBias) & kMask) << (2 * kCoordinateBits)) |
         ((static_cast<uint64_t>(y + kBias) & kMask) << kCoordinateBits) |
         (static_cast<uint64_t>(z + kBias) & kMask);
}

inline void UnpackKey(uint64_t key, int32_t* out) {
  constexpr uint64_t kMask = (uint64_t{1} << kCoordinateBits) - 1;
  constexpr int32_t kBias = -kMinCoordinate;
  out[0] = static_cast<int32_t>(key >> (3 * kCoordinateBits));
  out[1] = static_cast<int32_t>((key >> (2 * kCoordinateBits)) & kMask) - kBias;
  out[2] = static_cast<int32_t>((key >> kCoordinateBits) & kMask) - kBias;
  out[3] = static_cast<int32_t>(key & kMask) - kBias;
}

// Floor division for signed values (C++ '/' truncates toward zero).
inline int32_t FloorDiv(int32_t a, int32_t b) {
  int32_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Open addressing with linear probing over a power-of-two table kept at most
// half full. Values are row indices. Not thread-safe for writes; concurrent
// Find calls are safe once building is done.
class CoordinateHashMap {
 public:
  CoordinateHashMap() = default;
  explicit CoordinateHashMap(int64_t expected_size) { Reserve(expected_size); }

  // Sizes the table for `n` keys; drops what it held.
  void Reserve(int64_t n);

  // Inserts key -> row. Returns the row already stored if the key was
  // present (and stores nothing), else -1.
  int32_t Insert(uint64_t key, int32_t row);

  // Returns the row of `key`, or -1.
  int32_t Find(uint64_t key) const {
    uint64_t slot = Hash(key);
    while (true) {
      const Slot& s = slots_[slot];
      if (s.key == key) return s.row;
      if (s.key == kEmptyKey) return -1;
      slot = (slot + 1) & mask_;
    }
  }

  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }
  int64_t MemoryBytes() const { return capacity() * static_cast<int64_t>(sizeof(Slot)); }

 private:
  struct Slot {
    uint64_t key;
    int32_t row;
  };
  uint64_t Hash(uint64_t key) const {
    // Fibonacci hashing: neighbouring keys land far apart.
    return (key * 0x9E3779B97F4A7C15ull) >> shift_;
  }

  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int shift_ = 64;
  int64_t size_ = 0;
};

// Describes a coordinate for error messages: "(b, x, y, z)".
std::string CoordinateString(const int32_t* c);

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_COORDINATES_H_
