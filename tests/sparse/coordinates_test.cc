// Packed keys, the hash map, downsampling and kernel maps against brute
// force.
#include "sparse/coordinates.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <tuple>

#include "sparse/backend.h"
#include "sparse/coordinate_manager.h"
#include "sparse/determinism.h"
#include "sparse/ops.h"
#include "tests/sparse/test_util.h"

namespace trainsup::sparse {
namespace {

using testing::MakeRandomInput;

TEST(PackKey, RoundTripsAndOrdersLexicographically) {
  const int32_t cases[][4] = {{0, 0, 0, 0},
                              {kMaxBatchIndex, kMaxCoordinate, kMinCoordinate, -1},
                              {3, -5, 7, kMaxCoordinate},
                              {1, kMinCoordinate, kMinCoordinate, kMinCoordinate}};
  for (const auto& c : cases) {
    int32_t out[4];
    UnpackKey(PackKey(c[0], c[1], c[2], c[3]), out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], c[i]);
  }
  EXPECT_LT(PackKey(0, -1, 5, 5), PackKey(0, 0, -5, -5));
  EXPECT_LT(PackKey(0, 9, 9, 9), PackKey(1, -9, -9, -9));
  EXPECT_LT(PackKey(0, 0, 0, -2), PackKey(0, 0, 0, -1));
  EXPECT_NE(PackKey(kMaxBatchIndex, kMaxCoordinate, kMaxCoordinate, kMaxCoordinate), kEmptyKey);
}

// The device keys' layout (coordinate_manager.h) is PackKey's with the
// top bit flipped: packing, the fields, a packed shift and flooring agree
// with the host's PackKey and UnpackKey on random rows in range, the
// limits included.
TEST(DeviceKeys, TheLayoutIsPackKeysWithTheTopBitFlipped) {
  at::manual_seed(3);
  at::Tensor c = at::cat({at::randint(0, kMaxBatchIndex + 1, {200, 1}, at::kLong),
                          at::randint(kMinCoordinate, kMaxCoordinate + 1, {200, 3}, at::kLong)},
                         1);
  c[0] = at::tensor({int64_t{kMaxBatchIndex}, int64_t{kMinCoordinate}, int64_t{kMaxCoordinate},
                     int64_t{kMinCoordinate}});
  const at::Tensor keys = PackDeviceKeys(c);
  const std::array<at::Tensor, 3> fields = DeviceKeyFields(keys);
  const at::Tensor floored = FloorDeviceKeys(keys, 8);
  for (int64_t i = 0; i < c.size(0); ++i) {
    const int64_t* r = c[i].data_ptr<int64_t>();
    const auto v = [&](int a) { return static_cast<int32_t>(r[a]); };
    const uint64_t host = PackKey(v(0), v(1), v(2), v(3));
    ASSERT_EQ(static_cast<uint64_t>(keys[i].item<int64_t>()), host ^ kDeviceKeyBias) << i;
    for (int a = 0; a < 3; ++a) EXPECT_EQ(fields[a][i].item<int64_t>(), r[a + 1] - kMinCoordinate);
    EXPECT_EQ(static_cast<uint64_t>(floored[i].item<int64_t>()) ^ kDeviceKeyBias,
              PackKey(v(0), FloorDiv(v(1), 8) * 8, FloorDiv(v(2), 8) * 8, FloorDiv(v(3), 8) * 8))
        << i;
    // A shift that keeps every field in range adds PackedShift to the key.
    const int32_t d[3] = {v(1) > 0 ? -5 : 7, v(2) > 0 ? -1 : 3, v(3) > 0 ? -2 : 2};
    EXPECT_EQ(host + static_cast<uint64_t>(PackedShift(d[0], d[1], d[2])),
              PackKey(v(0), v(1) + d[0], v(2) + d[1], v(3) + d[2]))
        << i;
  }
}

TEST(FloorDiv, RoundsTowardNegativeInfinity) {
  EXPECT_EQ(FloorDiv(7, 2), 3);
  EXPECT_EQ(FloorDiv(-7, 2), -4);
  EXPECT_EQ(FloorDiv(-8, 2), -4);
  EXPECT_EQ(FloorDiv(-1, 4), -1);
  EXPECT_EQ(FloorDiv(0, 4), 0);
}

TEST(CoordinateHashMap, InsertFindAndGrow) {
  CoordinateHashMap map(2);
  for (int32_t i = 0; i < 1000; ++i) EXPECT_EQ(map.Insert(PackKey(0, i, -i, 2 * i), i), -1);
  EXPECT_EQ(map.size(), 1000);
  EXPECT_GE(map.capacity(), 2000);
  for (int32_t i = 0; i < 1000; ++i) EXPECT_EQ(map.Find(PackKey(0, i, -i, 2 * i)), i);
  EXPECT_EQ(map.Find(PackKey(0, 1, 1, 1)), -1);
  EXPECT_EQ(map.Insert(PackKey(0, 5, -5, 10), 77), 5);
  EXPECT_EQ(map.Find(PackKey(0, 5, -5, 10)), 5);
}

std::set<std::tuple<int, int, int, int>> Rows(const at::Tensor& c) {
  std::set<std::tuple<int, int, int, int>> s;
  auto a = c.accessor<int32_t, 2>();
  for (int64_t i = 0; i < c.size(0); ++i) s.insert({a[i][0], a[i][1], a[i][2], a[i][3]});
  return s;
}

TEST(CoordinateManager, DownsampleFloorsToTheCoarserGrid) {
  auto in = MakeRandomInput(2, 9, 0.3, 1, at::kFloat, 3, -9);
  CoordinateManager m;
  const CoordinateSetId id = m.AddCoordinates(in.coordinates, 1);
  const CoordinateSetId d2 = m.Downsample(id, 2);
  const CoordinateSetId d4 = m.Downsample(d2, 2);
  EXPECT_EQ(m.Downsample(id, 2), d2);  // cached
  EXPECT_EQ(m.Set(d2).stride, 2);
  EXPECT_EQ(m.Set(d4).stride, 4);
  EXPECT_EQ(m.Set(d2).parent, id);
  EXPECT_TRUE(m.Set(d2).sorted);
  for (int s : {2, 4}) {
    std::set<std::tuple<int, int, int, int>> want;
    auto a = in.coordinates.accessor<int32_t, 2>();
    for (int64_t i = 0; i < in.coordinates.size(0); ++i) {
      want.insert(
          {a[i][0], FloorDiv(a[i][1], s) * s, FloorDiv(a[i][2], s) * s, FloorDiv(a[i][3], s) * s});
    }
    EXPECT_EQ(Rows(m.Set(s == 2 ? d2 : d4).coordinates), want) << "stride " << s;
  }
}

// Issue 45: where the backend builds maps from device keys (the generic
// one here, on CPU tensors; on a GPU the cuda and generic ones), the input
// set's keys are packed and sorted there and Downsample makes its sets
// from the device keys. They are the host's sets bit for bit (keys,
// coordinates, permutations, bounds, parent), their host fields filled
// only when Set() asks (one copy each), and a strided convolution and its
// transpose, forward and backward, never ask.
TEST(CoordinateManager, DownsampleOnTheDeviceEqualsTheHostsAndCopiesOnlyWhenAsked) {
  auto in = MakeRandomInput(2, 11, 0.3, 3, at::kFloat, 5, -11);  // shuffled, negative
  CoordinateManager host, device;
  std::vector<CoordinateSetId> h = {host.AddCoordinates(in.coordinates, 1)};
  for (int level = 0; level < 3; ++level) h.push_back(host.Downsample(h.back(), 2));
  EXPECT_EQ(host.stats().device_downsamples, 0) << "the cpu backend downsamples on the host";
  BackendGuard generic(BackendKind::kGeneric);
  std::vector<CoordinateSetId> d = {device.AddCoordinates(in.coordinates, 1)};
  EXPECT_EQ(device.stats().device_inputs, 1);
  EXPECT_FALSE(device.Meta(d[0]).sorted) << "the rows are shuffled";
  for (int level = 0; level < 3; ++level) d.push_back(device.Downsample(d.back(), 2));
  EXPECT_EQ(device.Downsample(d[0], 2), d[1]);  // cached
  EXPECT_EQ(device.stats().device_downsamples, 3);
  for (int level = 1; level <= 3; ++level) {
    SCOPED_TRACE("stride " + std::to_string(1 << level));
    EXPECT_FALSE(device.Meta(d[level]).host_ready());
    EXPECT_EQ(device.Meta(d[level]).size(), host.Set(h[level]).size());
    EXPECT_EQ(device.Meta(d[level]).parent, d[level - 1]);
    EXPECT_EQ(device.Meta(d[level]).stride, 1 << level);
    EXPECT_TRUE(device.Meta(d[level]).sorted);
  }
  EXPECT_EQ(device.stats().host_copies, 0);
  for (int level = 0; level <= 3; ++level) {
    SCOPED_TRACE("stride " + std::to_string(1 << level));
    const CoordinateSet& got = device.Set(d[level]);
    const CoordinateSet& want = host.Set(h[level]);
    EXPECT_TRUE(at::equal(got.coordinates, want.coordinates));
    EXPECT_EQ(got.sorted_keys, want.sorted_keys);
    EXPECT_EQ(got.sorted_rows, want.sorted_rows);
    EXPECT_EQ(got.order.defined(), want.order.defined());
    if (want.order.defined()) {
      EXPECT_TRUE(at::equal(got.order, want.order));
      EXPECT_TRUE(at::equal(got.rank, want.rank));
    }
    EXPECT_EQ(got.batch_size, want.batch_size);
    for (int a = 0; a < 3; ++a) {
      EXPECT_EQ(got.min[a], want.min[a]);
      EXPECT_EQ(got.max[a], want.max[a]);
    }
  }
  EXPECT_EQ(device.stats().host_copies, 4);
  device.Set(d[1]);
  EXPECT_EQ(device.stats().host_copies, 4) << "a set was copied twice";

  SparseTensor x(in.features.clone().requires_grad_(true), in.coordinates);
  at::Tensor w = at::randn({8, 3, 4}).requires_grad_(true);
  at::Tensor back = at::randn({8, 4, 3}).requires_grad_(true);
  SparseTensor y = Conv(x, w, at::Tensor(), {2, 2, 1});
  SparseTensor z = ConvTranspose(y, back, at::Tensor(), {2, 2, 1});
  z.F().square().sum().backward();
  EXPECT_EQ(x.manager()->stats().device_downsamples, 1);
  EXPECT_EQ(x.manager()->stats().host_copies, 0);
  EXPECT_TRUE(at::equal(y.C(), host.Set(h[1]).coordinates));
  EXPECT_EQ(x.manager()->stats().host_copies, 1);
}

// The device path packs keys as PackKey does, at the range limits and
// with batch indices past 2^9 (whose keys have the top bit set).
TEST(CoordinateManager, DevicePackedKeysArePackKeysAtTheLimits) {
  const std::vector<std::array<int32_t, 4>> rows = {
      {kMaxBatchIndex, kMaxCoordinate, kMinCoordinate, -1},
      {600, 0, 0, 0},
      {0, kMinCoordinate, kMaxCoordinate, kMaxCoordinate},
      {511, -7, 9, kMinCoordinate},
      {512, 7, -9, 3}};
  at::Tensor c = at::empty({static_cast<int64_t>(rows.size()), 4}, at::kInt);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int a = 0; a < 4; ++a) c[i][a] = rows[i][a];
  }
  CoordinateManager m;
  BackendGuard generic(BackendKind::kGeneric);
  const CoordinateSet& set = m.Set(m.AddCoordinates(c, 1));
  EXPECT_EQ(m.stats().device_inputs, 1);
  std::vector<uint64_t> want;
  for (const auto& r : rows) want.push_back(PackKey(r[0], r[1], r[2], r[3]));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(set.sorted_keys, want);
  EXPECT_TRUE(at::equal(set.coordinates, c));
  EXPECT_EQ(set.batch_size, kMaxBatchIndex + 1);
}

// The device path's checks: a bad coordinate or a duplicate is named as
// the host names it, and nothing is registered.
TEST(CoordinateManager, AddCoordinatesOnTheDeviceRefusesWhatTheHostRefuses) {
  const at::Tensor dup = at::tensor({0, 1, 2, 3, 0, 4, 4, 4, 0, 1, 2, 3}, at::kInt).view({3, 4});
  const at::Tensor far =
      at::tensor({0, 0, 0, 0, 1, kMaxCoordinate + 1, 0, 0}, at::kLong).view({2, 4});
  const at::Tensor odd = at::tensor({0, 2, 4, 6, 0, 2, 3, 4}, at::kInt).view({2, 4});
  const at::Tensor batch = at::tensor({-1, 0, 0, 0}, at::kInt).view({1, 4});
  const std::pair<at::Tensor, int32_t> cases[] = {{dup, 1}, {far, 1}, {odd, 2}, {batch, 1}};
  for (const auto& [bad, stride] : cases) {
    CoordinateManager host, device;
    const std::string want = testing::ErrorMessage([&] { host.AddCoordinates(bad, stride); });
    ASSERT_FALSE(want.empty());
    BackendGuard generic(BackendKind::kGeneric);
    EXPECT_EQ(testing::ErrorMessage([&] { device.AddCoordinates(bad, stride); }), want);
    EXPECT_EQ(device.stats().coordinate_sets, 0);
  }
  // The same rows without the bad one take the device path (so the checks
  // above are the device path's).
  CoordinateManager device;
  BackendGuard generic(BackendKind::kGeneric);
  device.AddCoordinates(dup.slice(0, 0, 2), 1);
  EXPECT_EQ(device.stats().device_inputs, 1);
}

// Every (kernel offset, input row, output row) triple, by brute force.
std::set<std::tuple<int64_t, int32_t, int32_t>> BruteForce(const at::Tensor& in,
                                                           const at::Tensor& out, int kernel,
                                                           int step) {
  std::map<std::tuple<int, int, int, int>, int32_t> rows;
  auto a = in.accessor<int32_t, 2>();
  for (int64_t i = 0; i < in.size(0); ++i) rows[{a[i][0], a[i][1], a[i][2], a[i][3]}] = i;
  std::set<std::tuple<int64_t, int32_t, int32_t>> pairs;
  auto offsets = KernelOffsets(kernel);
  auto o = out.accessor<int32_t, 2>();
  for (int64_t j = 0; j < out.size(0); ++j) {
    for (size_t k = 0; k < offsets.size(); ++k) {
      auto it = rows.find({o[j][0], o[j][1] + offsets[k][0] * step, o[j][2] + offsets[k][1] * step,
                           o[j][3] + offsets[k][2] * step});
      if (it != rows.end())
        pairs.insert({static_cast<int64_t>(k), it->second, static_cast<int32_t>(j)});
    }
  }
  return pairs;
}

std::set<std::tuple<int64_t, int32_t, int32_t>> Pairs(const KernelMap& map) {
  std::set<std::tuple<int64_t, int32_t, int32_t>> pairs;
  const int32_t* in = map.in_rows.data_ptr<int32_t>();
  const int32_t* out = map.out_rows.data_ptr<int32_t>();
  for (int64_t k = 0; k < map.volume; ++k) {
    std::set<int32_t> outs, ins;
    for (int64_t p = map.begin[k]; p < map.begin[k + 1]; ++p) {
      pairs.insert({k, in[p], out[p]});
      EXPECT_TRUE(outs.insert(out[p]).second) << "output row repeated within offset " << k;
      EXPECT_TRUE(ins.insert(in[p]).second) << "input row repeated within offset " << k;
    }
  }
  return pairs;
}

TEST(CoordinateManager, KernelMapsMatchBruteForce) {
  for (bool deterministic : {false, true}) {
    DeterministicGuard guard(deterministic);
    for (int kernel : {1, 2, 3, 5}) {
      for (int dilation : {1, 2}) {
        for (int stride : {1, 2}) {
          SCOPED_TRACE("kernel " + std::to_string(kernel) + " dilation " +
                       std::to_string(dilation) + " stride " + std::to_string(stride) +
                       (deterministic ? " deterministic" : ""));
          auto in = MakeRandomInput(2, 10, 0.25, 1, at::kFloat, kernel * 10 + dilation, -5);
          CoordinateManager m;
          const CoordinateSetId id = m.AddCoordinates(in.coordinates, 1);
          const CoordinateSetId out = m.Downsample(id, stride);
          auto map = m.GetKernelMap(id, out, kernel, dilation);
          EXPECT_EQ(Pairs(*map),
                    BruteForce(in.coordinates, m.Set(out).coordinates, kernel, dilation));
          EXPECT_EQ(map->num_in, in.coordinates.size(0));
          EXPECT_EQ(map->num_out, m.Set(out).size());
        }
      }
    }
  }
}

TEST(CoordinateManager, KernelMapNearTheRangeLimitsMatchesBruteForce) {
  // Points on the edges of the representable range take the field-by-field
  // path; nothing may wrap into a neighbouring field.
  std::vector<int32_t> c;
  for (int32_t x : {kMinCoordinate, kMinCoordinate + 1, 0, kMaxCoordinate - 1, kMaxCoordinate}) {
    for (int32_t y : {kMinCoordinate, kMaxCoordinate}) {
      for (int32_t z : {kMaxCoordinate - 1, kMaxCoordinate, kMinCoordinate})
        c.insert(c.end(), {0, x, y, z});
    }
  }
  at::Tensor coords =
      at::from_blob(c.data(), {static_cast<int64_t>(c.size() / 4), 4}, at::kInt).clone();
  CoordinateManager m;
  const CoordinateSetId id = m.AddCoordinates(coords, 1);
  auto map = m.GetKernelMap(id, id, 3, 1);
  EXPECT_EQ(Pairs(*map), BruteForce(coords, coords, 3, 1));
}

TEST(CoordinateManager, CanonicalOrderSortsByKey) {
  auto in = MakeRandomInput(2, 6, 0.3, 1, at::kFloat, 9);
  CoordinateManager m;
  const CoordinateSetId id = m.AddCoordinates(in.coordinates, 1);
  EXPECT_FALSE(m.Set(id).sorted);
  at::Tensor order = m.CanonicalOrder(id);
  at::Tensor sorted = in.coordinates.index_select(0, order);
  auto a = sorted.accessor<int32_t, 2>();
  for (int64_t i = 1; i < sorted.size(0); ++i) {
    EXPECT_LT(PackKey(a[i - 1][0], a[i - 1][1], a[i - 1][2], a[i - 1][3]),
              PackKey(a[i][0], a[i][1], a[i][2], a[i][3]));
  }
}

}  // namespace
}  // namespace trainsup::sparse
