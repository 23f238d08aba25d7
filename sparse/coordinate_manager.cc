#include "sparse/coordinate_manager.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include "sparse/backend.h"
#include "sparse/determinism.h"

namespace trainsup::sparse {
namespace {

std::atomic<bool> g_deterministic{false};

// Rows per task in parallel loops over coordinates.
constexpr int64_t kGrain = 2048;

// The bounding box and batch size of n coordinates (N x 4 rows at c).
void Bounds(const int32_t* c, int64_t n, CoordinateSet* set) {
  int32_t max_batch = -1;
  for (int a = 0; a < 3; ++a) {
    set->min[a] = n > 0 ? kMaxCoordinate : 0;
    set->max[a] = n > 0 ? kMinCoordinate : 0;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = c + 4 * i;
    max_batch = std::max(max_batch, r[0]);
    for (int a = 0; a < 3; ++a) {
      set->min[a] = std::min(set->min[a], r[a + 1]);
      set->max[a] = std::max(set->max[a], r[a + 1]);
    }
  }
  set->batch_size = max_batch + 1;
}

bool PowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Whether sets used on `device` are made there (AddCoordinates,
// Downsample): where its backend builds kernel maps from device keys.
bool MadeOn(c10::Device device) { return BackendFor(device).builds_from_device_keys; }

// Per row of int64 coordinates [n, 4] (any device): a batch index or a
// spatial value outside what a key represents.
at::Tensor RowsOutOfRange(const at::Tensor& c) {
  const at::Tensor batch = c.select(1, 0), spatial = c.slice(1, 1, 4);
  return batch.lt(0)
      .logical_or(batch.gt(kMaxBatchIndex))
      .logical_or(spatial.lt(kMinCoordinate).logical_or(spatial.gt(kMaxCoordinate)).any(1));
}

// The device keys (biased, ascending) of a set downsampled to a
// power-of-two `stride`: each field's low bits cleared (flooring, since the
// fields' bias is a multiple of the stride), sorted (a radix sort on CUDA),
// duplicates merged (unique_consecutive, whose size is the one host
// synchronisation).
at::Tensor DownsampleKeys(const at::Tensor& keys, int32_t stride) {
  return std::get<0>(at::unique_consecutive(std::get<0>(at::sort(FloorDeviceKeys(keys, stride)))));
}

}  // namespace

at::Tensor PackDeviceKeys(const at::Tensor& coordinates) {
  TORCH_CHECK(coordinates.scalar_type() == at::kLong,
              "PackDeviceKeys: coordinates must be int64, got ", coordinates.scalar_type());
  const at::Tensor biased = coordinates.slice(1, 1, 4) - kMinCoordinate;
  at::Tensor keys = at::__lshift__(coordinates.select(1, 0), 3 * kCoordinateBits);
  for (int a = 0; a < 3; ++a) {
    keys = at::bitwise_or(keys, at::__lshift__(biased.select(1, a), (2 - a) * kCoordinateBits));
  }
  return at::bitwise_xor(keys, std::numeric_limits<int64_t>::min());
}

std::array<at::Tensor, 3> DeviceKeyFields(const at::Tensor& keys) {
  const int64_t mask = (int64_t{1} << kCoordinateBits) - 1;
  const at::Tensor raw = at::bitwise_xor(keys, std::numeric_limits<int64_t>::min());
  return {at::bitwise_and(at::__rshift__(raw, 2 * kCoordinateBits), mask),
          at::bitwise_and(at::__rshift__(raw, kCoordinateBits), mask), at::bitwise_and(raw, mask)};
}

int64_t PackedShift(int64_t dx, int64_t dy, int64_t dz) {
  return dx * (int64_t{1} << (2 * kCoordinateBits)) + dy * (int64_t{1} << kCoordinateBits) + dz;
}

at::Tensor FloorDeviceKeys(const at::Tensor& keys, int32_t stride) {
  const int64_t low = stride - 1;
  int64_t clear = 0;
  for (int a = 0; a < 3; ++a) clear |= low << (a * kCoordinateBits);
  return at::bitwise_and(keys, ~clear);
}

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

CoordinateSetId CoordinateManager::AddCoordinates(const at::Tensor& coordinates, int32_t stride) {
  TORCH_CHECK(coordinates.defined(), "coordinates: undefined tensor");
  TORCH_CHECK(coordinates.dim() == 2 && coordinates.size(1) == 4,
              "coordinates must be N x 4 (batch, x, y, z), got shape ", coordinates.sizes());
  TORCH_CHECK(coordinates.scalar_type() == at::kInt || coordinates.scalar_type() == at::kLong,
              "coordinates must be int32 or int64, got ", coordinates.scalar_type());
  TORCH_CHECK(stride >= 1, "tensor stride must be >= 1, got ", stride);
  if (MadeOn(coordinates.device())) {
    if (const auto id = AddOnDevice(coordinates, stride)) return *id;
  }
  // The host's checks name a failed one (a device path's too, on a copy).
  at::Tensor c = coordinates.to(at::kCPU);
  if (c.scalar_type() == at::kLong) {
    // Check the range before narrowing, so no value wraps silently.
    if (c.numel() > 0) {
      const at::Tensor bad = RowsOutOfRange(c);
      if (bad.any().item<bool>()) {
        int64_t row = bad.nonzero().select(1, 0)[0].item<int64_t>();
        auto r = c[row];
        TORCH_CHECK(false, "coordinate out of the representable range at row ", row, ": (",
                    r[0].item<int64_t>(), ", ", r[1].item<int64_t>(), ", ", r[2].item<int64_t>(),
                    ", ", r[3].item<int64_t>(), "); spatial values must be in [", kMinCoordinate,
                    ", ", kMaxCoordinate, "], batch indices in [0, ", kMaxBatchIndex, "]");
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

CoordinateSetId CoordinateManager::AddDeviceMade(std::shared_ptr<DeviceCoordinates> d,
                                                 int64_t count, int32_t stride, bool sorted,
                                                 CoordinateSetId parent, c10::Device device) {
  TORCH_CHECK(count < std::numeric_limits<int32_t>::max(), "too many coordinates: ", count);
  auto set = std::make_shared<CoordinateSet>();
  set->count = count;
  set->stride = stride;
  set->sorted = sorted;
  set->parent = parent;
  set->device_made = d;
  std::lock_guard<std::mutex> lock(mu_);
  sets_.push_back(std::move(set));
  const CoordinateSetId id = static_cast<CoordinateSetId>(sets_.size()) - 1;
  on_device_.emplace(
      std::make_tuple(id, static_cast<int>(device.type()), static_cast<int>(device.index())),
      std::move(d));
  ++stats_.coordinate_sets;
  ++(parent >= 0 ? stats_.device_downsamples : stats_.device_inputs);
  return id;
}

std::optional<CoordinateSetId> CoordinateManager::AddOnDevice(const at::Tensor& coordinates,
                                                              int32_t stride) {
  const at::Tensor c = coordinates.to(at::kLong);
  const int64_t n = c.size(0);
  if (n == 0 || n >= std::numeric_limits<int32_t>::max()) return std::nullopt;
  const at::Tensor bad =
      RowsOutOfRange(c).logical_or(c.slice(1, 1, 4).remainder(stride).ne(0).any(1)).any();
  const at::Tensor keys = PackDeviceKeys(c);
  const at::Tensor in_order = n < 2 ? at::ones({}, keys.options().dtype(at::kBool))
                                    : keys.slice(0, 1).gt(keys.slice(0, 0, n - 1)).all();
  auto [sorted_keys, order] = at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor duplicate =
      n < 2 ? at::zeros({}, keys.options().dtype(at::kBool))
            : sorted_keys.slice(0, 1).eq(sorted_keys.slice(0, 0, n - 1)).any();
  // The one host synchronisation: the three flags.
  const at::Tensor flags = at::stack({bad, in_order, duplicate}).to(at::kCPU);
  const bool* f = flags.data_ptr<bool>();
  if (f[0] || f[2]) return std::nullopt;
  auto d = std::make_shared<DeviceCoordinates>();
  d->keys = sorted_keys;
  if (!f[1]) {
    d->order = order;
    d->rows = order.to(at::kInt);
    d->rank = at::empty_like(order).scatter_(0, order, at::arange(n, order.options()));
  }
  return AddDeviceMade(std::move(d), n, stride, f[1], -1, coordinates.device());
}

CoordinateSetId CoordinateManager::AddValidated(at::Tensor coords, int32_t stride, bool check) {
  auto set = std::make_shared<CoordinateSet>();
  const int64_t n = coords.size(0);
  TORCH_CHECK(n < std::numeric_limits<int32_t>::max(), "too many coordinates: ", n);
  set->coordinates = coords;
  set->count = n;
  set->stride = stride;
  const int32_t* c = coords.data_ptr<int32_t>();
  if (check) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* r = c + 4 * i;
      TORCH_CHECK(BatchInRange(r[0]), "batch index out of range at row ", i, ": ",
                  CoordinateString(r), "; batch indices must be in [0, ", kMaxBatchIndex, "]");
      for (int a = 1; a < 4; ++a) {
        TORCH_CHECK(InRange(r[a]), "coordinate out of the representable range at row ", i, ": ",
                    CoordinateString(r), "; spatial values must be in [", kMinCoordinate, ", ",
                    kMaxCoordinate, "]");
        TORCH_CHECK(r[a] % stride == 0, "coordinate at row ", i, " ", CoordinateString(r),
                    " is not a multiple of the tensor stride ", stride);
      }
    }
  }
  std::vector<uint64_t>& keys = set->sorted_keys;
  keys.resize(n);
  bool sorted = true;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = c + 4 * i;
    keys[i] = PackKey(r[0], r[1], r[2], r[3]);
    if (i > 0 && keys[i] <= keys[i - 1]) sorted = false;
  }
  Bounds(c, n, set.get());
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
                  CoordinateString(c + 4 * static_cast<int64_t>(rows[p])), " at rows ", rows[p - 1],
                  " and ", rows[p], " (quantize the points first)");
    }
    keys.swap(ordered);
    set->order = at::tensor(at::ArrayRef<int32_t>(rows), at::kInt).to(at::kLong);
    set->rank = at::empty_like(set->order);
    set->rank.index_put_({set->order}, at::arange(n, at::kLong));
  }
  set->sorted = sorted;
  std::lock_guard<std::mutex> lock(mu_);
  sets_.push_back(std::move(set));
  ++stats_.coordinate_sets;
  return static_cast<CoordinateSetId>(sets_.size()) - 1;
}

std::shared_ptr<CoordinateSet> CoordinateManager::Get(CoordinateSetId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  TORCH_CHECK(id >= 0 && id < static_cast<CoordinateSetId>(sets_.size()), "unknown coordinate set ",
              id, " (this manager holds ", sets_.size(), ")");
  return sets_[id];
}

const CoordinateSet& CoordinateManager::Meta(CoordinateSetId id) const { return *Get(id); }

const CoordinateSet& CoordinateManager::Set(CoordinateSetId id) const {
  const std::shared_ptr<CoordinateSet> set = Get(id);
  if (set->device_made == nullptr) return *set;
  std::lock_guard<std::mutex> lock(host_mu_);
  if (set->host_ready()) return *set;
  // The device data to the host (copies, waiting for the device), the keys
  // unbiased and unpacked into each key's row: the fields a host-made set
  // has.
  const DeviceCoordinates& d = *set->device_made;
  const at::Tensor keys = d.keys.to(at::kCPU).contiguous();
  const int64_t* k = keys.data_ptr<int64_t>();
  const int64_t n = set->count;
  if (!set->sorted) {
    const at::Tensor rows = d.rows.to(at::kCPU).contiguous();
    set->sorted_rows.assign(rows.data_ptr<int32_t>(), rows.data_ptr<int32_t>() + n);
    set->order = d.order.to(at::kCPU);
    set->rank = d.rank.to(at::kCPU);
  }
  set->sorted_keys.resize(n);
  at::Tensor coords = at::empty({n, 4}, at::kInt);
  int32_t* c = coords.data_ptr<int32_t>();
  for (int64_t p = 0; p < n; ++p) {
    set->sorted_keys[p] = static_cast<uint64_t>(k[p]) ^ kDeviceKeyBias;
    UnpackKey(set->sorted_keys[p], c + 4 * static_cast<int64_t>(set->RowAt(p)));
  }
  Bounds(c, n, set.get());
  set->coordinates = coords;  // last: host_ready()
  std::lock_guard<std::mutex> stats_lock(mu_);
  ++stats_.host_copies;
  return *set;
}

CoordinateSetId CoordinateManager::Downsample(CoordinateSetId id, int32_t factor,
                                              c10::Device device) {
  TORCH_CHECK(factor >= 1, "downsampling factor must be >= 1, got ", factor);
  if (factor == 1) return id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = downsampled_.find({id, factor});
    if (it != downsampled_.end()) return it->second;
  }
  RECORD_USER_SCOPE("coordinates downsample");
  const int32_t in_stride = Meta(id).stride;
  const int64_t wide = static_cast<int64_t>(in_stride) * factor;
  TORCH_CHECK(wide <= kMaxCoordinate, "tensor stride ", wide, " is too large");
  const int32_t new_stride = static_cast<int32_t>(wide);
  if (MadeOn(device) && PowerOfTwo(in_stride) && PowerOfTwo(wide)) {
    auto d = std::make_shared<DeviceCoordinates>();
    d->keys = DownsampleKeys(OnDevice(id, device).keys, new_stride);
    const int64_t count = d->keys.size(0);
    const CoordinateSetId out =
        AddDeviceMade(std::move(d), count, new_stride, /*sorted=*/true, id, device);
    std::lock_guard<std::mutex> lock(mu_);
    downsampled_[{id, factor}] = out;
    return out;
  }
  const CoordinateSet& in = Set(id);
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
  const CoordinateSet& set = Meta(id);
  if (set.sorted) return at::arange(set.size(), at::kLong);
  return Set(id).order;
}

std::shared_ptr<const KernelMap> CoordinateManager::GetKernelMap(CoordinateSetId in,
                                                                 CoordinateSetId out,
                                                                 int32_t kernel_size,
                                                                 int32_t dilation,
                                                                 c10::Device device) {
  TORCH_CHECK(kernel_size >= 1, "kernel_size must be >= 1, got ", kernel_size);
  TORCH_CHECK(dilation >= 1, "dilation must be >= 1, got ", dilation);
  const bool deterministic = IsDeterministic();
  const auto key =
      std::make_tuple(in, out, kernel_size, dilation, deterministic,
                      static_cast<int>(device.type()), static_cast<int>(device.index()));
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
  // Backends that build from device keys read the sets' counts and
  // strides alone: a device-made set's host fields stay unfilled.
  const Backend& backend = BackendFor(device);
  const bool device_keys = backend.builds_from_device_keys;
  const CoordinateSet& in_set = device_keys ? Meta(in) : Set(in);
  const CoordinateSet& out_set = device_keys ? Meta(out) : Set(out);
  TORCH_CHECK(out_set.stride % in_set.stride == 0, "kernel map: output stride ", out_set.stride,
              " is not a multiple of input stride ", in_set.stride);
  KernelMapInputs inputs;
  inputs.in = &in_set;
  inputs.out = &out_set;
  inputs.same_set = in == out;
  inputs.kernel_size = kernel_size;
  inputs.offsets = KernelOffsets(kernel_size);
  inputs.step = static_cast<int64_t>(dilation) * in_set.stride;
  inputs.device = device;
  TORCH_CHECK(inputs.step * (kernel_size - 1) <= kMaxCoordinate, "kernel extent ",
              inputs.step * (kernel_size - 1), " is too large");
  if (device_keys) {
    inputs.in_device = &OnDevice(in, device);
    inputs.out_device = &OnDevice(out, device);
  }
  auto map = std::make_shared<KernelMap>();
  map->kernel_size = kernel_size;
  map->dilation = dilation;
  map->volume = static_cast<int64_t>(inputs.offsets.size());
  map->num_in = in_set.size();
  map->num_out = out_set.size();
  backend.build_kernel_map(inputs, map.get());
  // The centre of an odd kernel on one set maps every row to itself; in row
  // order when the set is sorted. Deterministic mode keeps to the gathered
  // path, so its arithmetic is the same whatever the input's row order.
  const bool symmetric = inputs.same_set && kernel_size % 2 == 1;
  if (symmetric && out_set.sorted && !deterministic) map->identity_offset = map->volume / 2;
  map->rows_sorted = in_set.sorted && out_set.sorted && !deterministic;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.kernel_map_builds;
  kernel_maps_[key] = map;
  return map;
}

const DeviceCoordinates& CoordinateManager::OnDevice(CoordinateSetId id, c10::Device device) {
  const auto key =
      std::make_tuple(id, static_cast<int>(device.type()), static_cast<int>(device.index()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = on_device_.find(key);
    if (it != on_device_.end()) return *it->second;
  }
  const CoordinateSet& set = Set(id);
  auto d = std::make_shared<DeviceCoordinates>();
  const int64_t n = set.size();
  at::Tensor keys = at::empty({n}, at::kLong);
  int64_t* k = keys.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) k[i] = static_cast<int64_t>(set.sorted_keys[i] ^ kDeviceKeyBias);
  d->keys = keys.to(device);
  if (!set.sorted) {
    d->rows = at::tensor(at::ArrayRef<int32_t>(set.sorted_rows), at::kInt).to(device);
    d->order = set.order.to(device);
    d->rank = set.rank.to(device);
  }
  std::lock_guard<std::mutex> lock(mu_);
  return *on_device_.emplace(key, std::move(d)).first->second;
}

CoordinateManagerStats CoordinateManager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace trainsup::sparse
