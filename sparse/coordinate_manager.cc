#include "sparse/coordinate_manager.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
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
  return AddValidated(c.contiguous(), stride, /*check=*/true);
}

CoordinateSetId CoordinateManager::AddValidated(at::Tensor coords, int32_t stride, bool check) {
  auto set = std::make_shared<CoordinateSet>();
  const int64_t n = coords.size(0);
  TORCH_CHECK(n < std::numeric_limits<int32_t>::max(), "too many coordinates: ", n);
  set->coordinates = coords;
  set->stride = stride;
  set->map.Reserve(n);
  const int32_t* c = coords.data_ptr<int32_t>();
  int32_t max_batch = -1;
  bool sorted = true;
  uint64_t previous = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = c + 4 * i;
    if (check) {
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
    const uint64_t key = PackKey(r[0], r[1], r[2], r[3]);
    const int32_t previous_row = set->map.Insert(key, static_cast<int32_t>(i));
    TORCH_CHECK(previous_row < 0, "duplicate coordinate ", CoordinateString(r), " at rows ",
                previous_row, " and ", i, " (quantize the points first)");
    if (i > 0 && key < previous) sorted = false;
    previous = key;
    max_batch = std::max(max_batch, r[0]);
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = canonical_orders_.find(id);
    if (it != canonical_orders_.end()) return it->second;
  }
  const int64_t n = set.size();
  at::Tensor order = at::arange(n, at::kLong);
  if (!set.sorted) {
    const int32_t* c = set.coordinates.data_ptr<int32_t>();
    std::vector<uint64_t> keys(n);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* r = c + 4 * i;
      keys[i] = PackKey(r[0], r[1], r[2], r[3]);
    }
    int64_t* o = order.data_ptr<int64_t>();
    // Keys are unique, so the order is total and any sort gives one answer.
    std::sort(o, o + n, [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  canonical_orders_[id] = order;
  return order;
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
  const CoordinateSet& in_set = Set(in);
  const CoordinateSet& out_set = Set(out);
  TORCH_CHECK(out_set.stride % in_set.stride == 0, "kernel map: output stride ",
              out_set.stride, " is not a multiple of input stride ", in_set.stride);
  at::Tensor order;
  if (deterministic && !out_set.sorted) order = CanonicalOrder(out);
  auto map = BuildKernelMap(in_set, out_set, order, kernel_size, dilation);
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.kernel_map_builds;
  kernel_maps_[key] = map;
  return map;
}

std::shared_ptr<const KernelMap> CoordinateManager::BuildKernelMap(
    const CoordinateSet& in, const CoordinateSet& out, const at::Tensor& out_order,
    int32_t kernel_size, int32_t dilation) const {
  const auto offsets = KernelOffsets(kernel_size);
  const int64_t volume = static_cast<int64_t>(offsets.size());
  const int64_t n_out = out.size();
  const int64_t step = static_cast<int64_t>(dilation) * in.stride;
  TORCH_CHECK(step * (kernel_size - 1) <= kMaxCoordinate, "kernel extent ",
              step * (kernel_size - 1), " is too large");
  // For an odd kernel on one set, offset k from row i finding row j means
  // offset volume-1-k from row j finds row i: look up half the offsets and
  // fill the other half by symmetry.
  const bool symmetric = (&in == &out) && (kernel_size % 2 == 1);
  const int64_t center = volume / 2;
  const int64_t lookups = symmetric ? center + 1 : volume;

  const int64_t* order = out_order.defined() ? out_order.data_ptr<int64_t>() : nullptr;
  // rank[row]: position of an output row in build order (for symmetric fills).
  std::vector<int32_t> rank;
  if (symmetric && order != nullptr) {
    rank.resize(n_out);
    for (int64_t r = 0; r < n_out; ++r) rank[order[r]] = static_cast<int32_t>(r);
  }
  // table[r * volume + k]: input row for output rank r and offset k, or -1.
  std::vector<int32_t> table(static_cast<size_t>(n_out * volume), -1);
  const int32_t* oc = out.coordinates.data_ptr<int32_t>();
  at::parallel_for(0, n_out, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t i = order ? order[r] : r;
      const int32_t* u = oc + 4 * i;
      int32_t* row = table.data() + r * volume;
      for (int64_t k = 0; k < lookups; ++k) {
        const int64_t x = u[1] + offsets[k][0] * step;
        const int64_t y = u[2] + offsets[k][1] * step;
        const int64_t z = u[3] + offsets[k][2] * step;
        if (x < kMinCoordinate || x > kMaxCoordinate || y < kMinCoordinate ||
            y > kMaxCoordinate || z < kMinCoordinate || z > kMaxCoordinate) {
          continue;
        }
        const int32_t j = in.map.Find(PackKey(u[0], static_cast<int32_t>(x),
                                              static_cast<int32_t>(y), static_cast<int32_t>(z)));
        if (j < 0) continue;
        row[k] = j;
        if (symmetric && k != center) {
          const int64_t rj = order ? rank[j] : j;
          table[rj * volume + (volume - 1 - k)] = static_cast<int32_t>(i);
        }
      }
    }
  });

  // Compact per offset, preserving build order: count per (chunk, offset),
  // prefix-sum offset-major, then fill.
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>((n_out + kGrain - 1) / kGrain,
                                                                 4 * at::get_num_threads()));
  const int64_t chunk_rows = (n_out + chunks - 1) / std::max<int64_t>(chunks, 1);
  std::vector<int64_t> counts(static_cast<size_t>(chunks * volume), 0);
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      int64_t* cnt = counts.data() + ch * volume;
      const int64_t r_end = std::min(n_out, (ch + 1) * chunk_rows);
      for (int64_t r = ch * chunk_rows; r < r_end; ++r) {
        const int32_t* row = table.data() + r * volume;
        for (int64_t k = 0; k < volume; ++k) cnt[k] += row[k] >= 0;
      }
    }
  });
  auto map = std::make_shared<KernelMap>();
  map->kernel_size = kernel_size;
  map->dilation = dilation;
  map->volume = volume;
  map->num_in = in.size();
  map->num_out = n_out;
  if (symmetric && order == nullptr && !IsDeterministic()) map->identity_offset = center;
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
  at::parallel_for(0, chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t ch = b; ch < e; ++ch) {
      int64_t* pos = start.data() + ch * volume;
      const int64_t r_end = std::min(n_out, (ch + 1) * chunk_rows);
      for (int64_t r = ch * chunk_rows; r < r_end; ++r) {
        const int32_t* row = table.data() + r * volume;
        const int32_t i = static_cast<int32_t>(order ? order[r] : r);
        for (int64_t k = 0; k < volume; ++k) {
          if (row[k] < 0) continue;
          const int64_t p = pos[k]++;
          in_rows[p] = row[k];
          out_rows[p] = i;
        }
      }
    }
  });
  return map;
}

CoordinateManagerStats CoordinateManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace trainsup::sparse
