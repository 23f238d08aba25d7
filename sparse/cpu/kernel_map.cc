#include "sparse/cpu/kernel_map.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "sparse/coordinates.h"

namespace trainsup::sparse::cpu {

namespace {

using Offsets = decltype(KernelMapInputs::offsets);

// Pairs of chunk ch for offset k are staged at [k * padded + ch * kChunk, ...).
constexpr int64_t kChunk = 4096;

// Whether adding an offset's packed delta to any output key is exact: no
// field of any shifted coordinate leaves its range.
bool PackedAddIsExact(const Offsets& offsets, int64_t step, const CoordinateSet& out) {
  int64_t lo = 0, hi = 0;
  for (const auto& o : offsets) {
    for (int a = 0; a < 3; ++a) {
      lo = std::min<int64_t>(lo, o[a] * step);
      hi = std::max<int64_t>(hi, o[a] * step);
    }
  }
  bool packed_add = true;
  for (int a = 0; a < 3 && out.size() > 0; ++a) {
    packed_add =
        packed_add && out.min[a] + lo >= kMinCoordinate && out.max[a] + hi <= kMaxCoordinate;
  }
  return packed_add;
}

// Each offset (times step) as a packed key delta.
std::vector<uint64_t> PackedDeltas(const Offsets& offsets, int64_t step) {
  const int64_t volume = static_cast<int64_t>(offsets.size());
  std::vector<uint64_t> delta(volume);
  for (int64_t k = 0; k < volume; ++k) {
    const int64_t d = offsets[k][0] * step * (int64_t{1} << (2 * kCoordinateBits)) +
                      offsets[k][1] * step * (int64_t{1} << kCoordinateBits) + offsets[k][2] * step;
    delta[k] = static_cast<uint64_t>(d);
  }
  return delta;
}

// What staging one chunk reads and writes.
struct Stage {
  const CoordinateSet& in;
  const CoordinateSet& out;
  const Offsets& offsets;
  const std::vector<uint64_t>& delta;
  int32_t kernel_size;
  int64_t volume, n_out, n_in, step, center, lookups, padded;
  bool symmetric, packed_add;
  int32_t* stage_in;
  int32_t* stage_out;
};

// Offsets come in columns of kernel_size that differ in z alone (z-major
// last); z is the key's lowest field, so with packed_add the inputs of
// one column for output u are the keys in [t, t + (kernel_size - 1) *
// step], t the key of its first offset. One merge per column then finds
// every offset of it (kernel_size merges fewer: 5 instead of 14 for a
// 3x3x3 kernel on one set, 13 instead of 63 for 5x5x5), with the same
// pairs in the same order as one merge per offset.
inline void StageChunkByColumns(const Stage& s, int64_t ch, int64_t* cnt) {
  const CoordinateSet& in = s.in;
  const CoordinateSet& out = s.out;
  const int64_t volume = s.volume, n_in = s.n_in, step = s.step, center = s.center;
  const int64_t padded = s.padded;
  const bool symmetric = s.symmetric;
  const uint64_t* ok = out.sorted_keys.data();
  const uint64_t* ik = in.sorted_keys.data();
  int32_t* stage_in = s.stage_in;
  int32_t* stage_out = s.stage_out;
  const int64_t column = s.kernel_size;
  const int64_t columns = volume / column;
  const int64_t p0 = ch * kChunk, p1 = std::min(s.n_out, p0 + kChunk);
  // Columns looked up: all, or (symmetric) those before the centre's
  // and the centre's offsets up to the centre; the rest mirror them.
  const int64_t last_column = symmetric ? columns / 2 : columns - 1;
  for (int64_t col = 0; col <= last_column; ++col) {
    const int64_t k0 = col * column;
    const int64_t k1 = symmetric && col == last_column ? center : k0 + column - 1;
    const uint64_t span = static_cast<uint64_t>((k1 - k0) * step);
    for (int64_t k = k0; k <= k1; ++k) {
      cnt[k] = 0;
      if (symmetric && k != center) cnt[volume - 1 - k] = 0;
    }
    int64_t j = -1;
    for (int64_t p = p0; p < p1; ++p) {
      const uint64_t t = ok[p] + s.delta[k0];
      if (j < 0) j = std::lower_bound(ik, ik + n_in, t) - ik;
      while (j < n_in && ik[j] < t) ++j;
      if (j == n_in) break;
      for (int64_t q = j; q < n_in && ik[q] - t <= span; ++q) {
        const uint64_t d = ik[q] - t;
        if (d % static_cast<uint64_t>(step) != 0) continue;
        const int64_t k = k0 + static_cast<int64_t>(d / static_cast<uint64_t>(step));
        const int32_t row_in = in.RowAt(q), row_out = out.RowAt(p);
        const int64_t at = k * padded + ch * kChunk;
        stage_in[at + cnt[k]] = row_in;
        stage_out[at + cnt[k]] = row_out;
        ++cnt[k];
        if (symmetric && k != center) {
          const int64_t mk = volume - 1 - k;
          const int64_t mat = mk * padded + ch * kChunk;
          stage_in[mat + cnt[mk]] = row_out;
          stage_out[mat + cnt[mk]] = row_in;
          ++cnt[mk];
        }
      }
    }
  }
}

// One merge per offset, targets computed field by field where packed_add
// is not exact.
inline void StageChunkByOffsets(const Stage& s, int64_t ch, int64_t* cnt) {
  const CoordinateSet& in = s.in;
  const CoordinateSet& out = s.out;
  const Offsets& offsets = s.offsets;
  const int64_t volume = s.volume, n_in = s.n_in, step = s.step, center = s.center;
  const int64_t padded = s.padded;
  const bool symmetric = s.symmetric, packed_add = s.packed_add;
  const uint64_t* ok = out.sorted_keys.data();
  const uint64_t* ik = in.sorted_keys.data();
  auto target = [&](int64_t p, int64_t k, uint64_t* t) -> bool {
    if (packed_add) {
      *t = ok[p] + s.delta[k];
      return true;
    }
    int32_t u[4];
    UnpackKey(ok[p], u);
    int64_t v[3];
    for (int a = 0; a < 3; ++a) {
      v[a] = u[a + 1] + offsets[k][a] * step;
      if (v[a] < kMinCoordinate || v[a] > kMaxCoordinate) return false;
    }
    *t = PackKey(u[0], static_cast<int32_t>(v[0]), static_cast<int32_t>(v[1]),
                 static_cast<int32_t>(v[2]));
    return true;
  };
  const int64_t p0 = ch * kChunk, p1 = std::min(s.n_out, p0 + kChunk);
  for (int64_t k = 0; k < s.lookups; ++k) {
    const bool mirror = symmetric && k != center;
    const int64_t mk = volume - 1 - k;
    int32_t* si = s.stage_in + k * padded + ch * kChunk;
    int32_t* so = s.stage_out + k * padded + ch * kChunk;
    int32_t* mi = s.stage_in + mk * padded + ch * kChunk;
    int32_t* mo = s.stage_out + mk * padded + ch * kChunk;
    int64_t c = 0, mc = 0;
    int64_t j = -1;
    for (int64_t p = p0; p < p1; ++p) {
      uint64_t t;
      if (!target(p, k, &t)) continue;
      if (j < 0) j = std::lower_bound(ik, ik + n_in, t) - ik;
      while (j < n_in && ik[j] < t) ++j;
      if (j == n_in) break;
      if (ik[j] != t) continue;
      const int32_t row_in = in.RowAt(j), row_out = out.RowAt(p);
      si[c] = row_in;
      so[c] = row_out;
      ++c;
      if (mirror) {
        mi[mc] = row_out;
        mo[mc] = row_in;
        ++mc;
      }
    }
    cnt[k] = c;
    if (mirror) cnt[mk] = mc;
  }
}

// Lays the staged pairs out offset by offset (chunks in order within
// each) into map's begin, in_rows and out_rows.
void GatherStaged(const Stage& s, int64_t chunks, const std::vector<int64_t>& counts,
                  KernelMap* map) {
  const int64_t volume = s.volume, padded = s.padded;
  map->begin.assign(volume + 1, 0);
  std::vector<int64_t> start(static_cast<size_t>(chunks * volume));
  int64_t total = 0;
  for (int64_t k = 0; k < volume; ++k) {
    map->begin[k] = total;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      start[ch * volume + k] = total;
      total += counts[ch * volume + k];
    }
  }
  map->begin[volume] = total;
  map->in_rows = at::empty({total}, at::kInt);
  map->out_rows = at::empty({total}, at::kInt);
  int32_t* in_rows = map->in_rows.data_ptr<int32_t>();
  int32_t* out_rows = map->out_rows.data_ptr<int32_t>();
  at::parallel_for(0, chunks * volume, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t ch = i / volume, k = i % volume;
      const int64_t c = counts[i];
      if (c == 0) continue;
      const int64_t src = k * padded + ch * kChunk;
      std::memcpy(in_rows + start[i], s.stage_in + src, c * sizeof(int32_t));
      std::memcpy(out_rows + start[i], s.stage_out + src, c * sizeof(int32_t));
    }
  });
}

}  // namespace

void BuildKernelMap(const KernelMapInputs& inputs, KernelMap* map) {
  const CoordinateSet& in = *inputs.in;
  const CoordinateSet& out = *inputs.out;
  const int32_t kernel_size = inputs.kernel_size;
  const auto& offsets = inputs.offsets;
  const int64_t volume = static_cast<int64_t>(offsets.size());
  const int64_t n_out = out.size();
  const int64_t step = inputs.step;
  // For an odd kernel on one set, offset k from u finding v means offset
  // volume-1-k from v finds u: look up half the offsets and mirror.
  const bool symmetric = inputs.same_set && (kernel_size % 2 == 1);
  const int64_t center = volume / 2;

  // Shifting every coordinate by one offset keeps key order, so each
  // offset is a merge of two sorted key lists. Adding the packed offset to
  // a key is exact while no field leaves its range; outside that (sets near
  // the range limits) targets are computed field by field.
  const bool packed_add = PackedAddIsExact(offsets, step, out);
  const std::vector<uint64_t> delta = PackedDeltas(offsets, step);

  // Stage: pairs of chunk ch for offset k go to slots [k][ch * kChunk, ...);
  // a chunk adds at most one pair per row to each offset. Only the slots
  // written are touched.
  const int64_t chunks = (n_out + kChunk - 1) / kChunk;
  const int64_t padded = chunks * kChunk;
  std::unique_ptr<int32_t[]> stage_in(new int32_t[static_cast<size_t>(volume * padded)]);
  std::unique_ptr<int32_t[]> stage_out(new int32_t[static_cast<size_t>(volume * padded)]);
  std::vector<int64_t> counts(static_cast<size_t>(chunks * volume), 0);
  const Stage stage{in,
                    out,
                    offsets,
                    delta,
                    kernel_size,
                    volume,
                    n_out,
                    in.size(),
                    step,
                    center,
                    symmetric ? center + 1 : volume,
                    padded,
                    symmetric,
                    packed_add,
                    stage_in.get(),
                    stage_out.get()};
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch) {
      int64_t* cnt = counts.data() + ch * volume;
      if (packed_add) {
        StageChunkByColumns(stage, ch, cnt);
      } else {
        StageChunkByOffsets(stage, ch, cnt);
      }
    }
  });
  GatherStaged(stage, chunks, counts, map);
}

}  // namespace trainsup::sparse::cpu
