#include "sparse/coordinate_manager.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "sparse/determinism.h"

namespace trainsup::sparse {
namespace {

std::atomic<bool> g_deterministic{false};

// Rows per task in parallel loops over coordinates.
constexpr int64_t kGrain = 2048;

}  // namespace

void SetDeterministic(bool on) { g_deterministic.store(on); }
bool IsDeterministic() { return g_deterministic.load(); }

std::vector<std::array<int32_t, 3>> KernelOffsets(int kernel_size) {
  TORCH_CHECK(kernel_size >= 1, "kernel_size must be >= 1, got ", kernel_size);
  const int lo = (kernel_size % 2 == 1) ? -(kernel_size - 1) / 2 : 0;
  std::vector<std::array<int32_t, 3>> offsets;
  offsets.reserve(static_cast<size_t>(kernel_size) * kernel_size * kernel_size);
  for (int x = 0; x < kernel_size; ++x) {
    for (int y = 0; y < kernel_size; ++y) {
      for (int z = 0; z < kernel_size; ++z) offsets.push_back({lo + x, lo + y, lo + z});
    }
  }
  return offsets;
}

CoordinateSetId CoordinateManager::AddCoordinates(const at::Tensor& coordinates,
                                                  int32_t stride) {
  TORCH_CHECK(coordinates.defined(), "coordinates: undefined tensor");
  TORCH_CHECK(coordinates.device().is_cpu(), "coordinates must be on the CPU, got ",
              coordinates.device());
  TORCH_CHECK(coordinates.dim() == 2 && coordinates.size(1) == 4,
              "coordinates must be N x 4 (batch, x, y, z), got shape ", coordinates.sizes());
  TORCH_CHECK(coordinates.scalar_type() == at::kInt || coordinates.scalar_type() == at::kLong,
              "coordinates must be int32 or int64, got ", coordinates.scalar_type());
  TORCH_CHECK(stride >= 1, "tensor stride must be >= 1, got ", stride);
  at::Tensor c = coordinates;
  if (c.scalar_type() == at::kLong) {
    // Check the range before narrowing, so no value wraps silently.
    if (c.numel() > 0) {
      auto spatial = c.slice(1, 1, 4);
      auto bad = (spatial < kMinCoordinate).logical_or(spatial > kMaxCoordinate).any(1);
      bad = bad.logical_or(c.select(1, 0) < 0).logical_or(c.select(1, 0) > kMaxBatchIndex);
      if (bad.any().item<bool>()) {
        int64_t row = bad.nonzero().select(1, 0)[0].item<int64_t>();
        auto r = c[row];
        TORCH_CHECK(false, "coordinate out of the representable range at row ", row, ": (",
                    r[0].item<int64_t>(), ", ", r[1].item<int64_t>(), ", ",
                    r[2].item<int64_t>(), ", ", r[3].item<int64_t>(),
                    "); spatial values must be in [", kMinCoordinate, ", ", kMaxCoordinate,
                    "], batch indices in [0, ", kMaxBatchIndex, "]");
      }
    }
    c = c.to(at::kInt);
  }
  // The set keeps its own copy: later writes to the caller's tensor (or
  // freeing a from_blob buffer) must not change it.
  c = c.contiguous();
  if (c.data_ptr() == coordinates.data_ptr()) c = c.clone();
  return AddValidated(c, stride, /*check=*/true);
}

CoordinateSetId CoordinateManager::AddValidated(at::Tensor coords, int32_t stride, bool check) {
  auto set = std::make_shared<CoordinateSet>();
  const int64_t n = coords.size(0);
  TORCH_CHECK(n < std::numeric_limits<int32_t>::max(), "too many coordinates: ", n);
  set->coordinates = coords;
  set->stride = stride;
  const int32_t* c = coords.data_ptr<int32_t>();
  if (check) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* r = c + 4 * i;
      TORCH_CHECK(BatchInRange(r[0]), "batch index out of range at row ", i, ": ",
                  CoordinateString(r), "; batch indices must be in [0, ", kMaxBatchIndex, "]");
      for (int a = 1; a < 4; ++a) {
        TORCH_CHECK(InRange(r[a]), "coordinate out of the representable range at row ", i,
                    ": ", CoordinateString(r), "; spatial values must be in [",
                    kMinCoordinate, ", ", kMaxCoordinate, "]");
        TORCH_CHECK(r[a] % stride == 0, "coordinate at row ", i, " ", CoordinateString(r),
                    " is not a multiple of the tensor stride ", stride);
      }
    }
  }
  std::vector<uint64_t>& keys = set->sorted_keys;
  keys.resize(n);
  int32_t max_batch = -1;
  for (int a = 0; a < 3; ++a) {
    set->min[a] = n > 0 ? kMaxCoordinate : 0;
    set->max[a] = n > 0 ? kMinCoordinate : 0;
  }
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = c + 4 * i;
    keys[i] = PackKey(r[0], r[1], r[2], r[3]);
    if (i > 0 && keys[i] <= keys[i - 1]) sorted = false;
    max_batch = std::max(max_batch, r[0]);
    for (int a = 0; a < 3; ++a) {
      set->min[a] = std::min(set->min[a], r[a + 1]);
      set->max[a] = std::max(set->max[a], r[a + 1]);
    }
  }
  if (!sorted) {
    std::vector<int32_t>& rows = set->sorted_rows;
    rows.resize(n);
    std::iota(rows.begin(), rows.end(), 0);
    std::sort(rows.begin(), rows.end(), [&](int32_t a, int32_t b) {
      return keys[a] < keys[b] || (keys[a] == keys[b] && a < b);
    });
    std::vector<uint64_t> ordered(n);
    for (int64_t p = 0; p < n; ++p) ordered[p] = keys[rows[p]];
    for (int64_t p = 1; p < n; ++p) {
      TORCH_CHECK(ordered[p] != ordered[p - 1], "duplicate coordinate ",
                  CoordinateString(c + 4 * static_cast<int64_t>(rows[p])), " at rows ",
                  rows[p - 1], " and ", rows[p], " (quantize the points first)");
    }
    keys.swap(ordered);
    set->order = at::tensor(at::ArrayRef<int32_t>(rows), at::kInt).to(at::kLong);
    set->rank = at::empty_like(set->order);
    set->rank.index_put_({set->order}, at::arange(n, at::kLong));
  }
  set->batch_size = max_batch + 1;
  set->sorted = sorted;
  std::lock_guard<std::mutex> lock(mu_);
  sets_.push_back(std::move(set));
  ++stats_.coordinate_sets;
  return static_cast<CoordinateSetId>(sets_.size()) - 1;
}

const CoordinateSet& CoordinateManager::Set(CoordinateSetId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(id >= 0 && id < static_cast<CoordinateSetId>(sets_.size()),
              "unknown coordinate set ", id, " (this manager holds ", sets_.size(), ")");
  return *sets_[id];
}

CoordinateSetId CoordinateManager::Downsample(CoordinateSetId id, int32_t factor) {
  TORCH_CHECK(factor >= 1, "downsampling factor must be >= 1, got ", factor);
  if (factor == 1) return id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = downsampled_.find({id, factor});
    if (it != downsampled_.end()) return it->second;
  }
  RECORD_USER_SCOPE("coordinates downsample");
  const CoordinateSet& in = Set(id);
  const int64_t wide = static_cast<int64_t>(in.stride) * factor;
  TORCH_CHECK(wide <= kMaxCoordinate, "tensor stride ", wide, " is too large");
  const int32_t new_stride = static_cast<int32_t>(wide);
  const int64_t n = in.size();
  const int32_t* c = in.coordinates.data_ptr<int32_t>();
  std::vector<uint64_t> keys(n);
  std::atomic<bool> out_of_range{false};
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int32_t* r = c + 4 * i;
      int32_t q[3];
      for (int a = 0; a < 3; ++a) {
        const int64_t v = static_cast<int64_t>(FloorDiv(r[a + 1], new_stride)) * new_stride;
        if (v < kMinCoordinate) out_of_range = true;
        q[a] = static_cast<int32_t>(std::max<int64_t>(v, kMinCoordinate));
      }
      keys[i] = PackKey(r[0], q[0], q[1], q[2]);
    }
  });
  TORCH_CHECK(!out_of_range.load(), "downsampling to stride ", new_stride,
              " leaves the representable coordinate range");
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  at::Tensor coords = at::empty({static_cast<int64_t>(keys.size()), 4}, at::kInt);
  int32_t* o = coords.data_ptr<int32_t>();
  at::parallel_for(0, static_cast<int64_t>(keys.size()), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) UnpackKey(keys[i], o + 4 * i);
  });
  const CoordinateSetId out = AddValidated(coords, new_stride, /*check=*/false);
  std::lock_guard<std::mutex> lock(mu_);
  sets_[out]->parent = id;
  downsampled_[{id, factor}] = out;
  return out;
}

at::Tensor CoordinateManager::CanonicalOrder(CoordinateSetId id) {
  const CoordinateSet& set = Set(id);
  if (set.sorted) return at::arange(set.size(), at::kLong);
  return set.order;
}

std::shared_ptr<const KernelMap> CoordinateManager::GetKernelMap(CoordinateSetId in,
                                                                 CoordinateSetId out,
                                                                 int32_t kernel_size,
                                                                 int32_t dilation) {
  TORCH_CHECK(kernel_size >= 1, "kernel_size must be >= 1, got ", kernel_size);
  TORCH_CHECK(dilation >= 1, "dilation must be >= 1, got ", dilation);
  const bool deterministic = IsDeterministic();
  const auto key = std::make_tuple(in, out, kernel_size, dilation, deterministic);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kernel_maps_.find(key);
    if (it != kernel_maps_.end()) {
      ++stats_.kernel_map_hits;
      return it->second;
    }
  }
  // Profiler scope names by kernel size.
  static constexpr const char* kScopes[] = {"kernel map 1x1x1", "kernel map 2x2x2",
                                            "kernel map 3x3x3", "kernel map other"};
  RECORD_USER_SCOPE(kScopes[kernel_size <= 3 ? kernel_size - 1 : 3]);
  const CoordinateSet& in_set = Set(in);
  const CoordinateSet& out_set = Set(out);
  TORCH_CHECK(out_set.stride % in_set.stride == 0, "kernel map: output stride ",
              out_set.stride, " is not a multiple of input stride ", in_set.stride);
  auto map = BuildKernelMap(in_set, out_set, kernel_size, dilation, deterministic);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.kernel_map_builds;
  kernel_maps_[key] = map;
  return map;
}

std::shared_ptr<const KernelMap> CoordinateManager::BuildKernelMap(
    const CoordinateSet& in, const CoordinateSet& out, int32_t kernel_size, int32_t dilation,
    bool deterministic) const {
  const auto offsets = KernelOffsets(kernel_size);
  const int64_t volume = static_cast<int64_t>(offsets.size());
  const int64_t n_out = out.size();
  const int64_t n_in = in.size();
  const int64_t step = static_cast<int64_t>(dilation) * in.stride;
  TORCH_CHECK(step * (kernel_size - 1) <= kMaxCoordinate, "kernel extent ",
              step * (kernel_size - 1), " is too large");
  // For an odd kernel on one set, offset k from u finding v means offset
  // volume-1-k from v finds u: look up half the offsets and mirror.
  const bool symmetric = (&in == &out) && (kernel_size % 2 == 1);
  const int64_t center = volume / 2;
  const int64_t lookups = symmetric ? center + 1 : volume;

  // Shifting every coordinate by one offset keeps key order, so each
  // offset is a merge of two sorted key lists. Adding the packed offset to
  // a key is exact while no field leaves its range; outside that (sets near
  // the range limits) targets are computed field by field.
  int64_t lo = 0, hi = 0;
  for (const auto& o : offsets) {
    for (int a = 0; a < 3; ++a) {
      lo = std::min<int64_t>(lo, o[a] * step);
      hi = std::max<int64_t>(hi, o[a] * step);
    }
  }
  bool packed_add = true;
  for (int a = 0; a < 3 && n_out > 0; ++a) {
    packed_add = packed_add && out.min[a] + lo >= kMinCoordinate && out.max[a] + hi <= kMaxCoordinate;
  }
  std::vector<uint64_t> delta(volume);
  for (int64_t k = 0; k < volume; ++k) {
    const int64_t d = offsets[k][0] * step * (int64_t{1} << (2 * kCoordinateBits)) +
                      offsets[k][1] * step * (int64_t{1} << kCoordinateBits) +
                      offsets[k][2] * step;
    delta[k] = static_cast<uint64_t>(d);
  }
  const uint64_t* ok = out.sorted_keys.data();
  const uint64_t* ik = in.sorted_keys.data();
  auto target = [&](int64_t p, int64_t k, uint64_t* t) -> bool {
    if (packed_add) {
      *t = ok[p] + delta[k];
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

  // Stage: pairs of chunk ch for offset k go to slots [k][ch * kChunk, ...);
  // a chunk adds at most one pair per row to each offset. Only the slots
  // written are touched.
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n_out + kChunk - 1) / kChunk;
  const int64_t padded = chunks * kChunk;
  std::unique_ptr<int32_t[]> stage_in(new int32_t[static_cast<size_t>(volume * padded)]);
  std::unique_ptr<int32_t[]> stage_out(new int32_t[static_cast<size_t>(volume * padded)]);
  std::vector<int64_t> counts(static_cast<size_t>(chunks * volume), 0);
  // Offsets come in columns of kernel_size that differ in z alone (z-major
  // last); z is the key's lowest field, so with packed_add the inputs of
  // one column for output u are the keys in [t, t + (kernel_size - 1) *
  // step], t the key of its first offset. One merge per column then finds
  // every offset of it (kernel_size merges fewer: 5 instead of 14 for a
  // 3x3x3 kernel on one set, 13 instead of 63 for 5x5x5), with the same
  // pairs in the same order as one merge per offset.
  const int64_t column = kernel_size;
  const int64_t columns = volume / column;
  at::parallel_for(0, chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t ch = cb; ch < ce; ++ch) {
      const int64_t p0 = ch * kChunk, p1 = std::min(n_out, p0 + kChunk);
      int64_t* cnt = counts.data() + ch * volume;
      if (packed_add) {
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
            const uint64_t t = ok[p] + delta[k0];
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
        continue;
      }
      for (int64_t k = 0; k < lookups; ++k) {
        const bool mirror = symmetric && k != center;
        const int64_t mk = volume - 1 - k;
        int32_t* si = stage_in.get() + k * padded + ch * kChunk;
        int32_t* so = stage_out.get() + k * padded + ch * kChunk;
        int32_t* mi = stage_in.get() + mk * padded + ch * kChunk;
        int32_t* mo = stage_out.get() + mk * padded + ch * kChunk;
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
  });

  auto map = std::make_shared<KernelMap>();
  map->kernel_size = kernel_size;
  map->dilation = dilation;
  map->volume = volume;
  map->num_in = n_in;
  map->num_out = n_out;
  // The centre of an odd kernel on one set maps every row to itself; in row
  // order when the set is sorted. Deterministic mode keeps to the gathered
  // path, so its arithmetic is the same whatever the input's row order.
  if (symmetric && out.sorted && !deterministic) map->identity_offset = center;
  map->rows_sorted = in.sorted && out.sorted && !deterministic;
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
      std::memcpy(in_rows + start[i], stage_in.get() + src, c * sizeof(int32_t));
      std::memcpy(out_rows + start[i], stage_out.get() + src, c * sizeof(int32_t));
    }
  });
  return map;
}

CoordinateManagerStats CoordinateManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace trainsup::sparse
