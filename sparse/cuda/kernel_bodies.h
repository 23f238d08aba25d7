// The work of the CUDA backend's kernels. Each op is a struct holding its
// operands. Most are element ops: size() elements, and operator()(i) does
// element i; kernels.cu runs one as a grid-stride kernel (one thread per
// element). A tiled op (ImplicitGemmTiles, WeightGradTiles) is a block's
// work over one output tile, in phases between barriers (see "Tiled ops"
// below). The
// host launcher of the cross-backend test (tests/sparse/host_launcher.h;
// targets cuda_steps_on_host, cuda_fused_on_host) runs the same structs on
// the CPU: elements in a shuffled order, and a tiled op's tiles and each
// phase's threads in shuffled orders. So the kernels' arithmetic and
// indexing are tested on every machine, and what only a GPU checks is the
// launch itself.
//
// No op uses atomics: every element of an op's output is written by one
// element i (or one thread of one tile), and the sums it forms run in a
// fixed order (offset order), so results do not depend on the order
// elements, tiles or threads run in.
//
// Plain C++ without nvcc; __host__ __device__ under nvcc. No CUDA or
// LibTorch headers.
#ifndef TRAINSUP_SPARSE_CUDA_KERNEL_BODIES_H_
#define TRAINSUP_SPARSE_CUDA_KERNEL_BODIES_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#define TRAINSUP_HD __host__ __device__
#else
#define TRAINSUP_HD
#endif
// Unrolled in device code (the register blocks' indices must be constants
// to stay in registers); the host compiler does not know the pragma.
#ifdef __CUDA_ARCH__
#define TRAINSUP_UNROLL _Pragma("unroll")
#else
#define TRAINSUP_UNROLL
#endif

namespace trainsup::sparse::cuda {

// The first position in keys[0, n) whose key is >= t.
TRAINSUP_HD inline int64_t LowerBound(const int64_t* keys, int64_t n, int64_t t) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < t) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Kernel-map search over sorted keys. Keys are int64 with the top bit
// flipped (kDeviceKeyBias in coordinate_manager.h), ascending. Element i =
// k * n_out + p, for lookup offset k in [0, lookups) and output position p
// in [0, n_out): the target is out_keys[p] + delta[k] when every field of
// the key stays in [0, 2^field_bits) after adding fields[3k..3k+2] (else
// no target); a binary search over in_keys finds it or not. Writes
// match[k * n_out + p] = its position in in_keys, and, when `mirror` (one
// set, odd kernel: lookups = volume / 2 + 1) and k != volume / 2,
// match[(volume - 1 - k) * n_out + j] = p for the found position j (offset
// -k from v finds u). `match` ([volume, n_out] int32) must be -1 on entry;
// entries without a pair stay -1. fields: int64 [3 * volume] per-axis
// shifts, delta: int64 [volume] packed shifts.
struct MapSearch {
  const int64_t* in_keys;
  int64_t n_in;
  const int64_t* out_keys;
  int64_t n_out;
  const int64_t* fields;
  const int64_t* delta;
  int field_bits;
  int64_t lookups;
  int64_t volume;
  bool mirror;
  int32_t* match;

  TRAINSUP_HD int64_t size() const { return n_in == 0 ? 0 : lookups * n_out; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int64_t mask = (int64_t{1} << field_bits) - 1;
    const int64_t k = i / n_out, p = i % n_out;
    const int64_t key = out_keys[p];
    // The unbiased key's fields: flipping the top bit back, then masking.
    const uint64_t raw = static_cast<uint64_t>(key) ^ (uint64_t{1} << 63);
    for (int a = 0; a < 3; ++a) {
      const int64_t f = static_cast<int64_t>((raw >> ((2 - a) * field_bits)) & mask);
      const int64_t moved = f + fields[3 * k + a];
      if (moved < 0 || moved > mask) return;
    }
    const int64_t t = key + delta[k];
    const int64_t j = LowerBound(in_keys, n_in, t);
    if (j >= n_in || in_keys[j] != t) return;
    match[k * n_out + p] = static_cast<int32_t>(j);
    if (mirror && k != volume / 2) match[(volume - 1 - k) * n_out + j] = static_cast<int32_t>(p);
  }
};

// Element i = k * n_out + p of `match` ([volume, n_out] int32, MapSearch's
// result): where match[i] >= 0 it is pair number position[i] - 1 (position:
// the inclusive prefix count of match >= 0 in row-major order, int32), and
// the pair is written there: in_pos = match[i], out_pos = p. Row-major
// order is the map's pair order (offset by offset, output keys ascending),
// so this is the compaction LibTorch's nonzero would do, without the host
// synchronisation nonzero needs to size its result.
struct CompactPairs {
  const int32_t* match;
  const int32_t* position;
  int64_t n_out;
  int64_t entries;  // volume * n_out
  int32_t* in_pos;
  int32_t* out_pos;

  TRAINSUP_HD int64_t size() const { return entries; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int32_t j = match[i];
    if (j < 0) return;
    const int64_t q = static_cast<int64_t>(position[i]) - 1;
    in_pos[q] = j;
    out_pos[q] = static_cast<int32_t>(i % n_out);
  }
};

// Element p of `pairs`: inverse[k * rows + row[p]] = p, where k is the
// offset whose pairs [begin[k], begin[k + 1]) hold p (begin: int64
// [volume + 1]). Rows are unique within an offset. `inverse` ([volume,
// rows] int32) must be -1 on entry.
struct InvertPairs {
  const int32_t* row;
  const int64_t* begin;
  int64_t volume;
  int64_t pairs;
  int64_t rows;
  int32_t* inverse;

  TRAINSUP_HD int64_t size() const { return pairs; }
  TRAINSUP_HD void operator()(int64_t p) const {
    // The offset of pair p: the last k with begin[k] <= p.
    int64_t lo = 0, hi = volume;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (begin[mid] <= p) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    inverse[lo * rows + row[p]] = static_cast<int32_t>(p);
  }
};

// Element i = r * cols + c: dst[r, c] = src[rows[r], c] for r in [0, n).
// T = uint16_t copies half rows (bfloat16 or float16) as their bits.
template <typename T>
struct GatherRows {
  const T* src;
  int64_t cols;
  const int32_t* rows;
  int64_t n;
  T* dst;

  TRAINSUP_HD int64_t size() const { return n * cols; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int64_t r = i / cols, c = i % cols;
    dst[i] = src[static_cast<int64_t>(rows[r]) * cols + c];
  }
};

// Element i = r * cols + c of `out` ([rows, cols]): out[r, c] += the sum
// over offsets k in [k0, k1), in increasing k, of buffer[p - base, c] with
// p = inverse[k * rows + r] (offsets without a pair for r add nothing).
// One element sums left to right: the result is the offsets' products
// added to `out` one offset after another.
template <typename T>
struct ScatterSum {
  const T* buffer;
  int64_t cols;
  const int32_t* inverse;
  int64_t rows;
  int64_t k0, k1, base;
  T* out;

  TRAINSUP_HD int64_t size() const { return k0 < k1 ? rows * cols : 0; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int64_t r = i / cols, c = i % cols;
    T acc = out[i];
    for (int64_t k = k0; k < k1; ++k) {
      const int32_t p = inverse[k * rows + r];
      if (p >= 0) acc += buffer[(static_cast<int64_t>(p) - base) * cols + c];
    }
    out[i] = acc;
  }
};

// Element i = r * cols + c of out ([rows, cols]) += bias[c]: the
// gather-GEMM dataflow's bias, after every offset's sum.
template <typename T>
struct AddBias {
  T* out;
  const T* bias;
  int64_t rows, cols;

  TRAINSUP_HD int64_t size() const { return rows * cols; }
  TRAINSUP_HD void operator()(int64_t i) const { out[i] += bias[i % cols]; }
};

// a * b + c with one rounding, the same on the host and the device. A plain
// a * b + c rounds twice on both: kernels.cu is built with --fmad=false,
// since nvcc would otherwise contract it on the device alone.
TRAINSUP_HD inline float Fma(float a, float b, float c) { return fmaf(a, b, c); }
TRAINSUP_HD inline double Fma(double a, double b, double c) { return fma(a, b, c); }

// Half features as their bits (bfloat16 and float16 tensors' storage),
// for the tiled ops' half inputs: each value widened to float32 where it
// is loaded, which is exact for both formats.
struct BFloat16Bits {
  uint16_t bits;
};
struct Float16Bits {
  uint16_t bits;
};
TRAINSUP_HD inline float FloatFromBits(uint32_t bits) {
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}
TRAINSUP_HD inline float Widen(float v) { return v; }
TRAINSUP_HD inline double Widen(double v) { return v; }
// bfloat16 is float32's top half.
TRAINSUP_HD inline float Widen(BFloat16Bits v) { return FloatFromBits(uint32_t{v.bits} << 16); }
// float16: 1 sign, 5 exponent (bias 15), 10 fraction bits. Normal values
// rebias the exponent to float32's 127; infinities and NaNs keep their
// fraction; subnormals are fraction x 2^-24, exact in float32.
TRAINSUP_HD inline float Widen(Float16Bits v) {
  const uint32_t sign = uint32_t{v.bits} >> 15 << 31;
  const uint32_t exponent = (v.bits >> 10) & 0x1fu, fraction = v.bits & 0x3ffu;
  if (exponent == 0x1fu) return FloatFromBits(sign | 0x7f800000u | fraction << 13);
  if (exponent != 0) return FloatFromBits(sign | (exponent + 112) << 23 | fraction << 13);
  const float magnitude = static_cast<float>(fraction) * 5.9604644775390625e-8f;  // 2^-24
  return sign != 0 ? -magnitude : magnitude;
}

// Tiled ops. An op with a Shared type runs as blocks of kThreads threads
// that share `Shared` and each keep a `Thread` (its registers), one block
// per output tile, in phases separated by barriers:
//   for each tile t in [0, tiles()):
//     Start(t, tid, thread)
//     for k in [0, offsets()):
//       if Index(t, k, tid, shared) is false for every thread: next k
//                                                (the any-test is a barrier)
//       for c in [0, chunks(t)):
//         Load(t, k, c, tid, shared)              then a barrier
//         Compute(t, c, tid, shared, thread)      then a barrier
//     Store(t, tid, thread)                       then a barrier
// A phase reads only what earlier phases wrote, never what another thread
// of its own phase writes. kernels.cu's EachTile runs it on the GPU (the
// any-test is __syncthreads_or); the host launcher runs each phase's
// threads one after another in a shuffled order, so the same code is
// tested on every machine. (The host runs a tile's phases in order, so
// it cannot catch a phase that reads what a later phase of the previous
// tile wrote: the barriers above are what keep that from happening.)
template <typename Op, typename = void>
struct IsTiled : std::false_type {};
template <typename Op>
struct IsTiled<Op, std::void_t<typename Op::Shared>> : std::true_type {};

// The tiled ops' shape: a block's 16 x 16 threads each hold a 4 x 4 block
// of a 64 x 64 output tile in registers (rows ty + 16 i, columns tx +
// 16 j: a warp's loads from shared memory are broadcasts or consecutive),
// and reductions run in chunks of 16 staged in shared memory, each staged
// value used by 16 threads.
inline constexpr int kTileThreads = 256;
inline constexpr int kTileSide = 16;  // the block's threads: kTileSide x kTileSide
inline constexpr int kTilePer = 4;    // each thread's rows and columns
inline constexpr int kTile = kTileSide * kTilePer;
inline constexpr int kTileChunk = 16;

// A thread's registers in a tiled op: its block of the tile.
template <typename T>
struct TileBlock {
  T acc[kTilePer][kTilePer];
};

template <typename T>
TRAINSUP_HD void ZeroBlock(TileBlock<T>& block) {
  for (int i = 0; i < kTilePer; ++i) {
    for (int j = 0; j < kTilePer; ++j) block.acc[i][j] = T(0);
  }
}

// The reduction's length left in chunk c of one of `total`: at most
// kTileChunk.
TRAINSUP_HD inline int InChunk(int64_t total, int64_t c) {
  const int64_t left = total - c * kTileChunk;
  return left < kTileChunk ? static_cast<int>(left) : kTileChunk;
}

// One step of a chunk: acc[i][j] = fma(a[row i], b[column j], acc[i][j])
// for the thread's rows ty + 16 i where row_used(that row) and its columns
// tx + 16 j; a and b are one staged row of the chunk (tile rows, tile
// columns).
template <typename T, typename RowUsed>
TRAINSUP_HD void AddOuterProduct(TileBlock<T>& block, int tid, const T* a, const T* b,
                                 const RowUsed& row_used) {
  const int ty = tid / kTileSide, tx = tid % kTileSide;
  TRAINSUP_UNROLL
  for (int i = 0; i < kTilePer; ++i) {
    const int m = ty + kTileSide * i;
    if (!row_used(m)) continue;
    const T av = a[m];
    TRAINSUP_UNROLL
    for (int j = 0; j < kTilePer; ++j) {
      block.acc[i][j] = Fma(av, b[tx + kTileSide * j], block.acc[i][j]);
    }
  }
}

// Writes the thread's block of the tile at (r0, c0) to out[r * ld + c],
// within rows x cols, plus bias[c] where bias is not null (one addition
// after the whole sum).
template <typename T>
TRAINSUP_HD void PutBlock(const TileBlock<T>& block, int tid, int64_t r0, int64_t c0, int64_t rows,
                          int64_t cols, int64_t ld, T* out, const T* bias = nullptr) {
  const int ty = tid / kTileSide, tx = tid % kTileSide;
  for (int i = 0; i < kTilePer; ++i) {
    const int64_t r = r0 + ty + kTileSide * i;
    if (r >= rows) continue;
    for (int j = 0; j < kTilePer; ++j) {
      const int64_t col = c0 + tx + kTileSide * j;
      if (col < cols)
        out[r * ld + col] = bias != nullptr ? block.acc[i][j] + bias[col] : block.acc[i][j];
    }
  }
}

// The fused dataflow's convolution over all kernel offsets, as a tiled
// implicit GEMM. Output element (r, c) of `out` ([rows, cols]) is
//   sum over offsets k in order, over j in [0, kdim) in order, of
//   a[from[inverse[k * rows + r]], j] * w[k * w_k + j * w_red + c * w_col]
// (offsets without a pair for row r add nothing), one fused multiply-add
// per term, starting from 0, then + bias[c] where `bias` is set: no
// atomics, and the same bits whatever order tiles and threads run in.
//   forward         a = features, kdim = C_in, from = src, inverse over dst,
//                   W_k[j, c]: w_red = C_out, w_col = 1
//   input gradient  a = output gradient, kdim = C_out, from = dst, inverse
//                   over src, W_k[c, j] (W_k^T): w_red = 1, w_col = C_out
// A block computes a 64 x 64 tile of `out`, each of its 16 x 16 threads a
// 4 x 4 block of it in registers (rows ty + 16 i, columns tx + 16 j). Per
// offset, the tile's rows' sources are read once (Index; an offset
// without a pair in the tile is skipped by the whole block), then the
// reduction runs in chunks of 16: the gathered rows and the weight slice
// are staged in shared memory (Load: the gather is in the loads), and
// every staged value is used by 16 threads (Compute). Each input value is
// read once per tile of 64 output columns, not once per output column.
template <typename T, typename In = T>
struct ImplicitGemmTiles {
  static constexpr int kThreads = kTileThreads;
  using Thread = TileBlock<T>;
  struct Shared {
    int64_t source[kTile];  // offset k's row of `a` per tile row, -1: none
    // + 2: a warp's loads write 2 rows x 16 channels; with rows 66 apart,
    // float32's 32 banks take them without a conflict.
    T a[kTileChunk][kTile + 2];
    T w[kTileChunk][kTile];
  };

  const In* a;
  int64_t kdim;
  const int32_t* from;
  const int32_t* inverse;
  int64_t volume;
  const In* w;
  int64_t w_k, w_red, w_col;
  int64_t rows, cols;
  T* out;
  // [cols], added to each output element after its sum (the forward's
  // bias), or null.
  const T* bias = nullptr;

  TRAINSUP_HD int64_t col_tiles() const { return (cols + kTile - 1) / kTile; }
  TRAINSUP_HD int64_t tiles() const {
    return rows == 0 || cols == 0 ? 0 : (rows + kTile - 1) / kTile * col_tiles();
  }
  TRAINSUP_HD int64_t offsets() const { return volume; }
  TRAINSUP_HD int64_t chunks(int64_t) const { return (kdim + kTileChunk - 1) / kTileChunk; }

  TRAINSUP_HD void Start(int64_t, int, Thread& thread) const { ZeroBlock(thread); }
  // Thread tid < kTile reads tile row tid's source for offset k.
  TRAINSUP_HD bool Index(int64_t t, int64_t k, int tid, Shared& shared) const {
    if (tid >= kTile) return false;
    const int64_t r = t / col_tiles() * kTile + tid;
    int64_t source = -1;
    if (r < rows) {
      const int32_t p = inverse[k * rows + r];
      if (p >= 0) source = from[p];
    }
    shared.source[tid] = source;
    return source >= 0;
  }
  // Chunk c of the reduction: a's gathered values (consecutive threads read
  // one row's consecutive values) and W_k's slice, zero outside.
  TRAINSUP_HD void Load(int64_t t, int64_t k, int64_t c, int tid, Shared& shared) const {
    const int64_t j0 = c * kTileChunk, c0 = t % col_tiles() * kTile;
    for (int e = tid; e < kTileChunk * kTile; e += kThreads) {
      const int m = e / kTileChunk, q = e % kTileChunk;
      const int64_t source = shared.source[m], j = j0 + q;
      shared.a[q][m] = source >= 0 && j < kdim ? Widen(a[source * kdim + j]) : T(0);
    }
    for (int e = tid; e < kTileChunk * kTile; e += kThreads) {
      const int q = e / kTile, n = e % kTile;
      const int64_t j = j0 + q, col = c0 + n;
      shared.w[q][n] = j < kdim && col < cols ? Widen(w[k * w_k + j * w_red + col * w_col]) : T(0);
    }
  }
  // Rows without a pair for the offset add nothing (not 0 x w).
  TRAINSUP_HD void Compute(int64_t, int64_t c, int tid, const Shared& shared,
                           Thread& thread) const {
    const auto has_pair = [&](int m) { return shared.source[m] >= 0; };
    const int n = InChunk(kdim, c);
    for (int q = 0; q < n; ++q) AddOuterProduct(thread, tid, shared.a[q], shared.w[q], has_pair);
  }
  TRAINSUP_HD void Store(int64_t t, int tid, const Thread& thread) const {
    PutBlock(thread, tid, t / col_tiles() * kTile, t % col_tiles() * kTile, rows, cols, cols, out,
             bias);
  }
};

// The fused dataflow's weight gradient, first op, tiled: element ((s *
// volume + k) * cin + a) * cout + b of `partial` ([splits, volume, cin,
// cout]) is the sum over the pairs p of offset k in split s (pairs
// [begin[k] + s * chunk, min(begin[k + 1], begin[k] + (s + 1) * chunk)))
// in order of f[src[p], a] * g[dst[p], b], fused multiply-adds from 0
// (0 for a split past the offset's pairs). `chunk` and `splits` depend on
// the map alone (steps.cc), so the sums do. A block computes a 64 x 64
// tile of one (split, offset)'s [cin, cout] slice: per chunk of 16 pairs,
// the pairs' rows of f and of g are gathered into shared memory (Load),
// and each thread adds their outer products into its 4 x 4 block.
template <typename T, typename In = T>
struct WeightGradTiles {
  static constexpr int kThreads = kTileThreads;
  using Thread = TileBlock<T>;
  struct Shared {
    T f[kTileChunk][kTile];
    T g[kTileChunk][kTile];
    int64_t first, pairs;  // the tile's First and Pairs, read by Index
  };

  const In* f;
  int64_t cin;
  const int32_t* src;
  const In* g;
  int64_t cout;
  const int32_t* dst;
  const int64_t* begin;
  int64_t volume, chunk, splits;
  T* partial;

  TRAINSUP_HD int64_t in_tiles() const { return (cin + kTile - 1) / kTile; }
  TRAINSUP_HD int64_t out_tiles() const { return (cout + kTile - 1) / kTile; }
  TRAINSUP_HD int64_t tiles() const { return splits * volume * in_tiles() * out_tiles(); }
  TRAINSUP_HD int64_t offsets() const { return 1; }
  // Tile t's (split, offset) slice: t / (in_tiles * out_tiles).
  TRAINSUP_HD int64_t Slice(int64_t t) const { return t / (in_tiles() * out_tiles()); }
  // The first pair of tile t's split, and how many it has (0 or more).
  TRAINSUP_HD int64_t First(int64_t t) const {
    return begin[Slice(t) % volume] + Slice(t) / volume * chunk;
  }
  TRAINSUP_HD int64_t Pairs(int64_t t) const {
    const int64_t end = begin[Slice(t) % volume + 1] - First(t);
    return end < 0 ? 0 : (end < chunk ? end : chunk);
  }
  TRAINSUP_HD int64_t chunks(int64_t t) const { return (Pairs(t) + kTileChunk - 1) / kTileChunk; }

  TRAINSUP_HD void Start(int64_t, int, Thread& thread) const { ZeroBlock(thread); }
  // Thread 0 reads the tile's pairs once for Load and Compute.
  TRAINSUP_HD bool Index(int64_t t, int64_t, int tid, Shared& shared) const {
    if (tid != 0) return false;
    shared.first = First(t);
    shared.pairs = Pairs(t);
    return shared.pairs > 0;
  }
  // Consecutive threads read one pair's consecutive channels.
  TRAINSUP_HD void Load(int64_t t, int64_t, int64_t c, int tid, Shared& shared) const {
    const int64_t p0 = shared.first + c * kTileChunk, n = InChunk(shared.pairs, c);
    const int64_t a0 = t / out_tiles() % in_tiles() * kTile, b0 = t % out_tiles() * kTile;
    for (int e = tid; e < kTileChunk * kTile; e += kThreads) {
      const int q = e / kTile, m = e % kTile;
      const bool pair = q < n;
      shared.f[q][m] =
          pair && a0 + m < cin ? Widen(f[static_cast<int64_t>(src[p0 + q]) * cin + a0 + m]) : T(0);
      shared.g[q][m] = pair && b0 + m < cout
                           ? Widen(g[static_cast<int64_t>(dst[p0 + q]) * cout + b0 + m])
                           : T(0);
    }
  }
  TRAINSUP_HD void Compute(int64_t, int64_t c, int tid, const Shared& shared,
                           Thread& thread) const {
    const auto every_row = [](int) { return true; };
    const int n = InChunk(shared.pairs, c);
    for (int q = 0; q < n; ++q) AddOuterProduct(thread, tid, shared.f[q], shared.g[q], every_row);
  }
  TRAINSUP_HD void Store(int64_t t, int tid, const Thread& thread) const {
    PutBlock(thread, tid, t / out_tiles() % in_tiles() * kTile, t % out_tiles() * kTile, cin, cout,
             cout, partial + Slice(t) * cin * cout);
  }
};

// The tiled ops on half inputs, summing in float32. (Named, so that the op
// list below needs no comma.)
using Bf16GemmTiles = ImplicitGemmTiles<float, BFloat16Bits>;
using Fp16GemmTiles = ImplicitGemmTiles<float, Float16Bits>;
using Bf16WeightGradTiles = WeightGradTiles<float, BFloat16Bits>;
using Fp16WeightGradTiles = WeightGradTiles<float, Float16Bits>;

// Second op: out[i] = the sum over s in order of partial[s * n + i], for
// i in [0, n).
template <typename T>
struct SumSplits {
  const T* partial;
  int64_t splits, n;
  T* out;

  TRAINSUP_HD int64_t size() const { return n; }
  TRAINSUP_HD void operator()(int64_t i) const {
    T acc = partial[i];
    for (int64_t s = 1; s < splits; ++s) acc += partial[s * n + i];
    out[i] = acc;
  }
};

// Training-mode BatchNorm over the rows of a [rows, cols] feature matrix,
// then ReLU if asked, in three ops forward and three backward. The rows
// are read in fixed blocks of kBnBlockRows, combined in block order: the
// sums depend on the row count alone, never on the element order, and the
// ReLU's cut is recomputed in backward by the same fused multiply-add as
// forward, so it agrees bit for bit. Per-channel vectors: [cols].
constexpr int64_t kBnBlockRows = 128;

TRAINSUP_HD inline int64_t BnBlocks(int64_t rows) {
  return (rows + kBnBlockRows - 1) / kBnBlockRows;
}
// Block b's rows: [b * kBnBlockRows, BnBlockEnd(b, rows)).
TRAINSUP_HD inline int64_t BnBlockEnd(int64_t b, int64_t rows) {
  const int64_t end = (b + 1) * kBnBlockRows;
  return end < rows ? end : rows;
}

// Forward, first op: element i = b * cols + c holds the mean of column c
// over block b's rows and the sum of squared deviations from it.
template <typename T>
struct BnBlockMoments {
  const T* x;
  int64_t rows, cols;
  T* mean;  // [blocks, cols]
  T* m2;    // [blocks, cols]

  TRAINSUP_HD int64_t size() const { return BnBlocks(rows) * cols; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int64_t b = i / cols, c = i % cols;
    const int64_t r0 = b * kBnBlockRows, r1 = BnBlockEnd(b, rows);
    T s = T(0);
    for (int64_t r = r0; r < r1; ++r) s += x[r * cols + c];
    const T m = s / static_cast<T>(r1 - r0);
    T q = T(0);
    for (int64_t r = r0; r < r1; ++r) {
      const T d = x[r * cols + c] - m;
      q = Fma(d, d, q);
    }
    mean[i] = m;
    m2[i] = q;
  }
};

// Forward, second op: element c combines the blocks in order in double
// (Chan et al.'s update) into the batch mean and biased variance, and
// writes stats [4, cols] = mean, scale = w / sqrt(var + eps), shift = b -
// mean * scale, invstd; and, where running_mean is not null, updates the
// running statistics in place as at::batch_norm does (momentum-weighted,
// the unbiased variance).
template <typename T>
struct BnCombine {
  const T* mean;
  const T* m2;
  int64_t rows, cols;
  const T* weight;
  const T* bias;
  double eps, momentum;
  T* running_mean;  // null: no running statistics
  T* running_var;
  T* stats;

  TRAINSUP_HD int64_t size() const { return cols; }
  TRAINSUP_HD void operator()(int64_t c) const {
    double n = 0, mu = 0, q = 0;
    for (int64_t b = 0; b < BnBlocks(rows); ++b) {
      const double nb = static_cast<double>(BnBlockEnd(b, rows) - b * kBnBlockRows);
      const double total = n + nb;
      const double delta = static_cast<double>(mean[b * cols + c]) - mu;
      mu += delta * nb / total;
      q += static_cast<double>(m2[b * cols + c]) + delta * delta * n * nb / total;
      n = total;
    }
    const double var = q / n;
    const double invstd = 1.0 / sqrt(var + eps);
    const double scale = static_cast<double>(weight[c]) * invstd;
    stats[c] = static_cast<T>(mu);
    stats[cols + c] = static_cast<T>(scale);
    stats[2 * cols + c] = static_cast<T>(static_cast<double>(bias[c]) - mu * scale);
    stats[3 * cols + c] = static_cast<T>(invstd);
    if (running_mean != nullptr) {
      const double unbias = n > 1 ? n / (n - 1) : 1.0;
      running_mean[c] =
          static_cast<T>(static_cast<double>(running_mean[c]) * (1 - momentum) + mu * momentum);
      running_var[c] = static_cast<T>(static_cast<double>(running_var[c]) * (1 - momentum) +
                                      var * unbias * momentum);
    }
  }
};

// x * scale + shift at element i, one fused multiply-add: the output
// before the ReLU.
template <typename T>
TRAINSUP_HD inline T BnAffine(const T* x, const T* stats, int64_t cols, int64_t i) {
  const int64_t c = i % cols;
  return Fma(x[i], stats[cols + c], stats[2 * cols + c]);
}

// The output gradient at element i where the ReLU passed it, else 0: the
// cut recomputed from x by BnAffine, the expression forward applied.
template <typename T>
TRAINSUP_HD inline T BnPassedGrad(const T* x, const T* dy, const T* stats, int64_t cols, bool relu,
                                  int64_t i) {
  return relu && !(BnAffine(x, stats, cols, i) > T(0)) ? T(0) : dy[i];
}

// Forward, third op: element i of y = x * scale + shift, then max(., 0)
// if relu (one fused multiply-add, as backward recomputes it).
template <typename T>
struct BnApply {
  const T* x;
  const T* stats;
  int64_t rows, cols;
  bool relu;
  T* y;

  TRAINSUP_HD int64_t size() const { return rows * cols; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const T v = BnAffine(x, stats, cols, i);
    y[i] = relu && !(v > T(0)) ? T(0) : v;
  }
};

// Backward, first op: element i = b * cols + c holds, over block b's rows
// in order, the sums of g and of g (x - mean), where g is the output
// gradient, zero where the ReLU cut.
template <typename T>
struct BnBlockGradSums {
  const T* x;
  const T* dy;
  const T* stats;
  int64_t rows, cols;
  bool relu;
  T* sum_g;   // [blocks, cols]
  T* sum_gx;  // [blocks, cols]

  TRAINSUP_HD int64_t size() const { return BnBlocks(rows) * cols; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int64_t b = i / cols, c = i % cols;
    const int64_t r0 = b * kBnBlockRows, r1 = BnBlockEnd(b, rows);
    T sg = T(0), sgx = T(0);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t e = r * cols + c;
      const T g = BnPassedGrad(x, dy, stats, cols, relu, e);
      sg += g;
      sgx = Fma(g, x[e] - stats[c], sgx);
    }
    sum_g[i] = sg;
    sum_gx[i] = sgx;
  }
};

// Backward, second op: element c sums the blocks in order in double and
// writes coef [3, cols] = a = w invstd, k1 = sum_g / rows, k2 = invstd^2
// sum_gx / rows (for the input gradient), grad_weight = sum_gx invstd and
// grad_bias = sum_g.
template <typename T>
struct BnGradCombine {
  const T* sum_g;
  const T* sum_gx;
  const T* stats;
  const T* weight;
  int64_t rows, cols;
  T* coef;
  T* grad_weight;
  T* grad_bias;

  TRAINSUP_HD int64_t size() const { return cols; }
  TRAINSUP_HD void operator()(int64_t c) const {
    double sg = 0, sgx = 0;
    for (int64_t b = 0; b < BnBlocks(rows); ++b) {
      sg += static_cast<double>(sum_g[b * cols + c]);
      sgx += static_cast<double>(sum_gx[b * cols + c]);
    }
    const double invstd = static_cast<double>(stats[3 * cols + c]);
    const double n = static_cast<double>(rows);
    coef[c] = static_cast<T>(static_cast<double>(weight[c]) * invstd);
    coef[cols + c] = static_cast<T>(sg / n);
    coef[2 * cols + c] = static_cast<T>(invstd * invstd * sgx / n);
    grad_weight[c] = static_cast<T>(sgx * invstd);
    grad_bias[c] = static_cast<T>(sg);
  }
};

// Backward, third op: element i of dx = a (g - k1 - (x - mean) k2).
template <typename T>
struct BnInputGrad {
  const T* x;
  const T* dy;
  const T* stats;
  const T* coef;
  int64_t rows, cols;
  bool relu;
  T* dx;

  TRAINSUP_HD int64_t size() const { return rows * cols; }
  TRAINSUP_HD void operator()(int64_t i) const {
    const int64_t c = i % cols;
    const T g = BnPassedGrad(x, dy, stats, cols, relu, i);
    dx[i] = coef[c] * (g - coef[cols + c] - (x[i] - stats[c]) * coef[2 * cols + c]);
  }
};

}  // namespace trainsup::sparse::cuda

// Every op type, once: X(Op) for each. The launchers' overloads (kernels.h
// and .cu, steps.h's Launcher, the GPU and host launchers) expand it, so an
// op added here is launched everywhere or the build fails.
// clang-format off
#define TRAINSUP_CUDA_OPS(X) \
  X(MapSearch) X(CompactPairs) X(InvertPairs) \
  X(GatherRows<float>) X(GatherRows<double>) X(GatherRows<uint16_t>) X(ScatterSum<float>) X(ScatterSum<double>) \
  X(AddBias<float>) X(AddBias<double>) \
  X(ImplicitGemmTiles<float>) X(ImplicitGemmTiles<double>) X(Bf16GemmTiles) X(Fp16GemmTiles) \
  X(WeightGradTiles<float>) X(WeightGradTiles<double>) X(Bf16WeightGradTiles) X(Fp16WeightGradTiles) X(SumSplits<float>) X(SumSplits<double>) \
  X(BnBlockMoments<float>) X(BnBlockMoments<double>) X(BnCombine<float>) X(BnCombine<double>) \
  X(BnApply<float>) X(BnApply<double>) X(BnBlockGradSums<float>) X(BnBlockGradSums<double>) \
  X(BnGradCombine<float>) X(BnGradCombine<double>) X(BnInputGrad<float>) X(BnInputGrad<double>)
// clang-format on

#endif  // TRAINSUP_SPARSE_CUDA_KERNEL_BODIES_H_
