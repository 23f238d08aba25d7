#include "sparse/coordinates.h"

#include <sstream>

namespace trainsup::sparse {

void CoordinateHashMap::Reserve(int64_t n) {
  int bits = 4;
  while ((int64_t{1} << bits) < 2 * n + 1) ++bits;
  slots_.assign(size_t{1} << bits, Slot{kEmptyKey, -1});
  mask_ = (uint64_t{1} << bits) - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

int32_t CoordinateHashMap::Insert(uint64_t key, int32_t row) {
  if (2 * (size_ + 1) > capacity()) {
    // Grow: rehash every stored key into a table twice the size.
    std::vector<Slot> old;
    old.swap(slots_);
    int64_t n = size_;
    Reserve(2 * (n + 1));
    for (const Slot& s : old) {
      if (s.key != kEmptyKey) Insert(s.key, s.row);
    }
  }
  uint64_t slot = Hash(key);
  while (true) {
    Slot& s = slots_[slot];
    if (s.key == key) return s.row;
    if (s.key == kEmptyKey) {
      s.key = key;
      s.row = row;
      ++size_;
      return -1;
    }
    slot = (slot + 1) & mask_;
  }
}

std::string CoordinateString(const int32_t* c) {
  std::ostringstream os;
  os << "(" << c[0] << ", " << c[1] << ", " << c[2] << ", " << c[3] << ")";
  return os.str();
}

}  // namespace trainsup::sparse
