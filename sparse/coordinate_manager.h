// The coordinate manager owns the coordinate sets of one batch (one per
// tensor stride and origin), their hash maps, and the kernel maps between
// them. Layers with the same geometry share one kernel map: it is built once
// per device and served from the cache afterwards. A set made on the host
// has its keys and permutations copied once per device that needs them
// (OnDevice); a set made on a device (device-key backends: AddCoordinates
// there, Downsample) is copied to the host only when Set() asks.
#ifndef TRAINSUP_SPARSE_COORDINATE_MANAGER_H_
#define TRAINSUP_SPARSE_COORDINATE_MANAGER_H_

#include <ATen/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "sparse/coordinates.h"

namespace trainsup::sparse {

using CoordinateSetId = int64_t;

// Offsets of a cubic kernel of `kernel_size` per axis, in units of
// dilation * input tensor stride. Odd sizes are centred ([-r, r]); even sizes
// run [0, k-1], as MinkowskiEngine does for its stride-2 downsampling
// kernels. Offsets are ordered x-major, then y, then z, so for odd sizes
// offset i and offset volume-1-i are opposite.
std::vector<std::array<int32_t, 3>> KernelOffsets(int kernel_size);

// One coordinate set's data on a device, for the ops and kernel-map
// builders that run there.
struct DeviceCoordinates {
  // int64 [N]: CoordinateSet::sorted_keys with the top bit flipped
  // (kDeviceKeyBias), so that signed int64 order is key order.
  at::Tensor keys;
  at::Tensor rows;         // int32 [N]: the row of each key; undefined for a sorted set
  at::Tensor order, rank;  // CoordinateSet::order and rank; undefined for a sorted set
};

// One coordinate set: N unique coordinates at one tensor stride.
//
// A set made on a device (issue 45: Downsample there, or AddCoordinates
// where the backend of the coordinates' device builds maps from device
// keys) starts with its DeviceCoordinates alone (device_made). Its host
// fields (coordinates, sorted_keys, sorted_rows, order, rank, min, max,
// batch_size) are filled from them at the first CoordinateManager::Set()
// on it, one copy to the host; Meta() reads the others without that copy.
struct CoordinateSet {
  at::Tensor coordinates;  // N x 4 int32, contiguous: batch, x, y, z.
  int64_t count = 0;       // N
  int32_t stride = 1;      // Every spatial coordinate is a multiple of it.
  // The keys in ascending order, and the row of each (empty when the rows
  // are in key order already, i.e. sorted_rows[p] == p).
  std::vector<uint64_t> sorted_keys;
  std::vector<int32_t> sorted_rows;
  // The same permutation as int64 tensors, and its inverse (rank[row] =
  // position in key order); undefined for sorted sets.
  at::Tensor order, rank;
  int32_t min[3] = {0, 0, 0};  // Bounding box of the spatial coordinates.
  int32_t max[3] = {0, 0, 0};
  int32_t batch_size = 0;       // Largest batch index + 1 (0 when empty).
  bool sorted = false;          // Rows are in key order already.
  CoordinateSetId parent = -1;  // The set this one was downsampled from.
  // A device-made set's data on the device that made it; null for
  // host-made sets.
  std::shared_ptr<const DeviceCoordinates> device_made;
  // The host fields are filled: always for a host-made set; for a
  // device-made one once Set() has copied them (coordinates last).
  bool host_ready() const { return coordinates.defined(); }
  int64_t size() const { return count; }
  int32_t RowAt(int64_t p) const { return sorted ? static_cast<int32_t>(p) : sorted_rows[p]; }
};

// Flipping the top bit adds 2^63 modulo 2^64, which commutes with adding a
// packed offset (the kernel map's shifted keys).
inline constexpr uint64_t kDeviceKeyBias = uint64_t{1} << 63;

// The device keys' layout, in one place for the ATen code that packs,
// floors and searches them (the manager, the generic and cuda map builds):
// PackKey's fields (coordinates.h), the top bit flipped.
//
// Device keys of coordinate rows [n, 4] int64 (batch, x, y, z), on their
// device, whose values are in range (checked by the caller). Shifts into
// the top bit wrap (ATen shifts int64 as uint64).
at::Tensor PackDeviceKeys(const at::Tensor& coordinates);
// The spatial fields of device keys (x, y, z), each biased into
// [0, 2^kCoordinateBits), int64.
std::array<at::Tensor, 3> DeviceKeyFields(const at::Tensor& keys);
// What a shift of (dx, dy, dz) grid units adds to a packed key whose
// fields stay in range: PackKey(b, x + dx, ...) - PackKey(b, x, ...).
int64_t PackedShift(int64_t dx, int64_t dy, int64_t dz);
// Device keys with each spatial field's low bits below a power-of-two
// `stride` cleared: flooring to the coarser grid (the fields' bias is a
// multiple of any such stride).
at::Tensor FloorDeviceKeys(const at::Tensor& keys, int32_t stride);

// Tables a backend derives from a kernel map's pairs and keeps for the
// map's life, built at their first use: the cuda steps' inverse tables
// (int32 [volume, rows]: the pair of each offset that reads or writes each
// row), one per side of the map. Shared by the map and by the autograd
// nodes of the ops on it, so a backward finds what its forward built.
struct PairTables {
  std::mutex mu;
  at::Tensor by_in_row;   // over the input set's rows; undefined until built
  at::Tensor by_out_row;  // over the output set's rows
};

// Gather/scatter pairs per kernel offset: for offset k, pairs
// [begin[k], begin[k+1]) map input row in_rows[p] to output row out_rows[p].
// Within one offset every output row and every input row appears at most
// once, so a scatter over one offset never collides. The pairs of one
// offset are in key order of the coordinates (for the mirrored half of an
// odd kernel on one set, of the input coordinates), so the map depends on
// the coordinates alone, never on the order of the rows.
// The pair lists live on the device of the features that use the map.
struct KernelMap {
  int32_t kernel_size = 0;
  int32_t dilation = 1;
  int64_t volume = 0;
  std::vector<int64_t> begin;  // volume + 1 entries.
  // `begin` as an int64 tensor on the map's device, uploaded once by
  // backends that build maps there (the cuda steps), so that no convolution
  // copies it again; undefined otherwise.
  at::Tensor device_begin;
  at::Tensor in_rows;   // int32 [pairs]
  at::Tensor out_rows;  // int32 [pairs]
  int64_t num_in = 0;   // rows of the input set
  int64_t num_out = 0;  // rows of the output set
  // Offset whose pairs are (p, p) for every row p in order (the centre of
  // an odd kernel on one set, built outside deterministic mode), or -1.
  int64_t identity_offset = -1;
  // Input and output rows ascend within every offset (both sets sorted);
  // left false in deterministic mode, which keeps to one arithmetic path.
  bool rows_sorted = false;
  std::shared_ptr<PairTables> tables = std::make_shared<PairTables>();
  int64_t pairs() const { return begin.empty() ? 0 : begin.back(); }
  int64_t count(int64_t k) const { return begin[k + 1] - begin[k]; }
};

struct CoordinateManagerStats {
  int64_t kernel_map_builds = 0;
  int64_t kernel_map_hits = 0;
  int64_t coordinate_sets = 0;
  int64_t device_downsamples = 0;  // sets made on a device by Downsample
  int64_t device_inputs = 0;       // sets made on a device by AddCoordinates
  int64_t host_copies = 0;         // device-made sets whose host fields were filled
};

class CoordinateManager {
 public:
  CoordinateManager() = default;
  CoordinateManager(const CoordinateManager&) = delete;
  CoordinateManager& operator=(const CoordinateManager&) = delete;

  // Registers `coordinates` (N x 4, int32 or int64) at tensor stride
  // `stride`. Every spatial value must be a multiple of `stride` and
  // within [kMinCoordinate, kMaxCoordinate]; batch indices within
  // [0, kMaxBatchIndex]; rows unique. Throws c10::Error naming the first
  // offending row otherwise. Where the backend of the coordinates' device
  // builds maps from device keys (generic, cuda), the keys are packed,
  // checked and sorted there with ATen (one host synchronisation, the
  // checks' flags; a failed check is named by the host's checks on a
  // copy); otherwise (the cpu backend) on the host.
  CoordinateSetId AddCoordinates(const at::Tensor& coordinates, int32_t stride);

  // The set, its host fields filled (for a device-made set, copied from
  // the device at the first call).
  const CoordinateSet& Set(CoordinateSetId id) const;
  // The set's count, stride, sortedness, parent and device_keys, without
  // filling a device-made set's host fields (which may still be empty).
  const CoordinateSet& Meta(CoordinateSetId id) const;

  // The set at stride Set(id).stride * factor: every coordinate floored to
  // the coarser grid, duplicates merged, rows in key order. Cached per
  // (id, factor). Made on `device` when the backend there builds kernel
  // maps from device keys (as AddCoordinates decides) and both strides are
  // powers of two (flooring is then masking the keys' low bits): from the
  // set's device keys with ATen, with one host synchronisation (the new
  // set's size) and no host copy of the keys; otherwise on the host.
  CoordinateSetId Downsample(CoordinateSetId id, int32_t factor,
                             c10::Device device = c10::Device(c10::DeviceType::CPU));

  // The kernel map from input set `in` to output set `out` for a cubic
  // kernel, with its pair lists on `device`. The input offset of output
  // coordinate u for kernel offset k is u + k * dilation * Set(in).stride.
  // `out` is `in` itself (stride 1) or a set at a coarser stride. Built by
  // the backend that runs on `device` (backend.h) once per key and device,
  // then served from the cache.
  std::shared_ptr<const KernelMap> GetKernelMap(
      CoordinateSetId in, CoordinateSetId out, int32_t kernel_size, int32_t dilation,
      c10::Device device = c10::Device(c10::DeviceType::CPU));

  // Set(id)'s keys, rows and permutations on `device`: copied once, then
  // served from the cache (the CPU's too, as tensors).
  const DeviceCoordinates& OnDevice(CoordinateSetId id, c10::Device device);

  // Row permutation that sorts Set(id) by key (int64, length N). Identity
  // for sets that are sorted already.
  at::Tensor CanonicalOrder(CoordinateSetId id);

  CoordinateManagerStats stats() const;

 private:
  CoordinateSetId AddValidated(at::Tensor coordinates, int32_t stride, bool check);
  // Adds a set made on `device` from its data there.
  CoordinateSetId AddDeviceMade(std::shared_ptr<DeviceCoordinates> d, int64_t count, int32_t stride,
                                bool sorted, CoordinateSetId parent, c10::Device device);
  // AddCoordinates' device path: nullopt when a check fails.
  std::optional<CoordinateSetId> AddOnDevice(const at::Tensor& coordinates, int32_t stride);
  std::shared_ptr<CoordinateSet> Get(CoordinateSetId id) const;

  mutable std::mutex mu_;
  mutable std::mutex host_mu_;  // filling device-made sets' host fields
  std::vector<std::shared_ptr<CoordinateSet>> sets_;
  std::map<std::pair<CoordinateSetId, int32_t>, CoordinateSetId> downsampled_;
  // Keys: (in, out, kernel size, dilation, deterministic, device type,
  // device index).
  std::map<std::tuple<CoordinateSetId, CoordinateSetId, int32_t, int32_t, bool, int, int>,
           std::shared_ptr<const KernelMap>>
      kernel_maps_;
  std::map<std::tuple<CoordinateSetId, int, int>, std::shared_ptr<const DeviceCoordinates>>
      on_device_;
  mutable CoordinateManagerStats stats_;  // Set() counts host_copies
};

}  // namespace trainsup::sparse

#endif  // TRAINSUP_SPARSE_COORDINATE_MANAGER_H_
