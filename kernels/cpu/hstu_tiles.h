// SIMD tiles of the jagged HSTU attention (hstu_attention.h): the tile sizes, the path's vectors
// (isa.h: 64 bytes on avx512, 32 on avx2, 16 generic) and the two register-blocked micro-kernels that
// every pass multiplies its tiles with, their blocks sized to the path's registers.
//
//   tile_nt      C   [rows, BLK]  = X [rows, Dp] . YT [Dp, BLK]          (scores, dL/dweights)
//   tile_tn_acc  Out [rows, Ep]  += PT[:cols, :rows]^T . Z [cols, Ep]     (outputs, gradients)
//   tile_nn_acc  Out [rows, Ep]  += P[:rows, :cols] . Z [cols, Ep]        (the same, P untransposed)
//
// Both skip work that the causal mask makes zero. `tri` says which entries (row r, column c) of the
// tile a pass uses: 0 all, LOWER c <= r, UPPER c >= r (a diagonal tile: query and key tiles at the
// same offset). tile_nt computes, per block of rows, only the column vectors that hold used entries
// and no vector past `ncols` (the entries it leaves unwritten are never read: the passes mask or
// skip them); tile_tn_acc skips the terms c whose weights the mask set to exactly 0. The terms kept
// are summed in the same order as without skipping, so the results are bitwise the same.
#include "isa.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

// once per path (isa.h): GRLIB_ISA_NS is the path's namespace
#if defined(GRLIB_ISA_NS) && !defined(GRLIB_HSTU_TILES_H)
#define GRLIB_HSTU_TILES_H
namespace GRLIB_ISA_NS::hstu {

constexpr int64_t BLK = 64;  // query and key tile size (rows of a tile)
constexpr int64_t VEC = 16;  // feature dims are zero-padded to a multiple of this in scratch
constexpr int64_t VBYTES = GRLIB_VBYTES;  // bytes per vector on this path (isa.h)
constexpr int64_t RB = 6;    // rows per micro-kernel step (register blocking, with NVB / WB vectors per row)
// vectors per row of a micro-kernel block: 32 zmm hold 6 x 4 accumulators (+ 4 loads); 16 ymm or
// xmm hold 6 x 2 (+ 2 loads and a broadcast), where 6 x 4 would need 28
constexpr int64_t REGS_WIDE = VBYTES == 64;
constexpr int64_t NVB_MAX = REGS_WIDE ? 8 : 2;  // tile_nt (doubles on avx512: 8 vectors of a row, as before)
constexpr int64_t WB = REGS_WIDE ? 4 : 2;       // tile_tn
constexpr int LOWER = 1, UPPER = -1;  // tri: entries c <= r, entries c >= r of a diagonal tile
// avx2: the micro-kernels read their column slab from a packed panel (tile_nt_panels, tile_tn_panels).
// Measured (AMD EPYC Zen 4, 8 x 1024 tokens, 2 heads x 128, fwd + bwd): 101.6 ms with, 123.4 without;
// the generic path's forward read 79.2 with, 74.8 without, so it keeps reading in place.
constexpr bool PANELS = VBYTES == 32;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// VBYTES-byte vectors through the GCC/Clang vector extension: one register of the path (zmm, ymm,
// xmm / NEON q). Lanes: VBYTES / 4 floats or VBYTES / 8 doubles.
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(VBYTES)));
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(VBYTES)));
};
template <typename T>
using V = typename Vec<T>::type;
template <typename T>
constexpr int64_t LANES = VBYTES / sizeof(T);

template <typename T>
inline V<T> vload(const T* p) {
  V<T> v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline void vstore(T* p, const V<T>& v) { __builtin_memcpy(p, &v, sizeof(v)); }

// Integer vectors of the same lanes (masks of V<T>'s lanes).
template <typename T>
struct IVec;
template <>
struct IVec<float> {
  typedef int32_t lane;
  typedef int32_t type __attribute__((vector_size(VBYTES)));
};
template <>
struct IVec<double> {
  typedef int64_t lane;
  typedef int64_t type __attribute__((vector_size(VBYTES)));
};

// f(c, in) for the vectors that hold [x0, x1) (c: the vector's first entry, in: its lanes inside
// the range); each pass reads and writes whole vectors, and keeps the lanes outside (`in ? new :
// old`). Rows must have room through round_up(x1, LANES) (a tile row of BLK values has).
template <typename T, typename F>
inline void for_vectors(int64_t x0, int64_t x1, const F& f) {
  using M = typename IVec<T>::type;
  using E = typename IVec<T>::lane;
  constexpr int64_t L = LANES<T>;
  M lane;
  for (int64_t l = 0; l < L; ++l) lane[l] = static_cast<E>(l);
  for (int64_t c = x0 / L * L; c < x1; c += L) {
    const M x = lane + static_cast<E>(c);
    f(c, (x >= static_cast<E>(x0)) & (x < static_cast<E>(x1)));
  }
}

// dst[x] = dst[x] + add(c)[x - c] for x in [x0, x1) only (c: the start of x's vector), one vector at
// a time (for_vectors): a short range (a run of a tile row) costs a vector op or two instead of a
// scalar loop. dst must have room through round_up(x1, LANES) (a tile row of BLK values has).
template <typename T, typename F>
inline void masked_add(T* dst, int64_t x0, int64_t x1, const F& add) {
  for_vectors<T>(x0, x1, [&](int64_t c, const auto& in) {
    const V<T> d = vload(dst + c);
    vstore(dst + c, in ? d + add(c) : d);
  });
}

// dst[x] += v for x in [x0, x1) (masked_add).
template <typename T>
inline void add_const(T* dst, int64_t x0, int64_t x1, T v) {
  masked_add(dst, x0, x1, [v](int64_t) { return V<T>{} + v; });
}

// dst[x] += src[x] for x in [x0, x1) (masked_add; src is read through round_up(x1, LANES) too).
template <typename T>
inline void add_row(T* dst, const T* src, int64_t x0, int64_t x1) {
  masked_add(dst, x0, x1, [src](int64_t c) { return vload(src + c); });
}

// ---- transposing ----------------------------------------------------------------------------

#if GRLIB_VBYTES == 64
// dst[c * ldd + r] = src[r * lds + c] for a 16 x 16 block of floats, in registers: 16 row loads,
// four rounds of 16 shuffles (32-bit, 64-bit, then 128-bit lane pairs twice), 16 row stores.
// A copy: the values are moved bit for bit.
inline void transpose16(const float* __restrict src, int64_t lds, float* __restrict dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {  // t[i], t[i + 1]: rows i, i + 1 interleaved by 32 bits
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // 64-bit interleave of the pairs (i, i + 2) and (i + 1, i + 3)
    const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
    const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int h = 0; h < 16; h += 8)  // 128-bit lanes: even and odd lanes of r[h + i], r[h + i + 4]
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {  // and again across the two halves: row i and row i + 8 of the result
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + i * ldd, r[i]);
}
#endif

// rows [n, Dp] -> dst [Dp, BLK] transposed, zero padded past n (n <= BLK; Dp a multiple of VEC).
// On the avx512 path, floats go in 16 x 16 register blocks (a partial block through a zero-padded copy);
// else (and for doubles) entry by entry. Either way a copy: bitwise the same values.
template <typename T>
void transpose_rows(const T* __restrict rows, int64_t n, int64_t Dp, T* __restrict dst) {
#if GRLIB_VBYTES == 64
  if constexpr (sizeof(T) == 4) {
    const int64_t full = n / 16 * 16;
    for (int64_t r0 = 0; r0 < full; r0 += 16)
      for (int64_t d0 = 0; d0 < Dp; d0 += 16) transpose16(rows + r0 * Dp + d0, Dp, dst + d0 * BLK + r0, BLK);
    if (full < n) {
      alignas(64) float part[16 * 16];
      for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
        for (int64_t r = 0; r < 16; ++r)
          if (full + r < n)
            std::memcpy(part + r * 16, rows + (full + r) * Dp + d0, 16 * sizeof(float));
          else
            std::fill(part + r * 16, part + r * 16 + 16, 0.0f);
        transpose16(part, 16, dst + d0 * BLK + full, BLK);
      }
    }
    const int64_t done = round_up(n, 16);
    if (done < BLK)
      for (int64_t d = 0; d < Dp; ++d) std::fill(dst + d * BLK + done, dst + d * BLK + BLK, T(0));
    return;
  }
#endif
  std::fill(dst, dst + Dp * BLK, T(0));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < Dp; ++d) dst[d * BLK + r] = rows[r * Dp + d];
}

// ---- micro-kernels (Dp, Ep: multiples of VEC; tiles have row stride BLK) -----------------------

// C[i, c] = sum_d X[i, d] * YT[d, c] for i < R, c < NV * LANES (YT: row stride ldy, C: BLK): R x NV
// accumulators stay in registers.
template <typename T, int64_t R, int64_t NV>
inline void tile_nt_rows(const T* __restrict X, const T* __restrict YT, int64_t ldy, int64_t Dp, T* __restrict C) {
  V<T> acc[R][NV] = {};
  for (int64_t d = 0; d < Dp; ++d) {
    V<T> y[NV];
#pragma GCC unroll 8
    for (int64_t n = 0; n < NV; ++n) y[n] = vload(YT + d * ldy + n * LANES<T>);
#pragma GCC unroll 6
    for (int64_t i = 0; i < R; ++i) {
      const T x = X[i * Dp + d];
#pragma GCC unroll 8
      for (int64_t n = 0; n < NV; ++n) acc[i][n] += x * y[n];
    }
  }
#pragma GCC unroll 6
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int64_t n = 0; n < NV; ++n) vstore(C + i * BLK + n * LANES<T>, acc[i][n]);
}

// tile_nt_rows with nv (0 .. BLK / LANES) column vectors, chosen at run time.
template <typename T, int64_t R, int64_t NV = std::min(BLK / LANES<T>, NVB_MAX)>
inline void tile_nt_span(const T* X, const T* YT, int64_t ldy, int64_t Dp, T* C, int64_t nv) {
  if constexpr (NV > 1) {
    if (nv < NV) {
      tile_nt_span<T, R, NV - 1>(X, YT, ldy, Dp, C, nv);
      return;
    }
  }
  if (nv >= NV) tile_nt_rows<T, R, NV>(X, YT, ldy, Dp, C);
}

// The column vectors [n0, n1) of rows [r, r + R) that `tri` uses below ncols (LOWER: columns <=
// r + R - 1, UPPER: columns >= r).
template <typename T, int64_t R>
inline std::pair<int64_t, int64_t> used_vectors(int64_t r, int64_t ncols, int tri) {
  constexpr int64_t L = LANES<T>;
  int64_t n0 = 0, n1 = (ncols + L - 1) / L;
  if (tri == LOWER) n1 = std::min(n1, (r + R + L - 1) / L);
  if (tri == UPPER) n0 = std::min(r / L, n1);
  return {n0, n1};
}

// Rows [r, r + R) of C: the column vectors below ncols that hold entries `tri` uses.
template <typename T, int64_t R>
inline void tile_nt_block(const T* X, const T* YT, int64_t Dp, T* C, int64_t r, int64_t ncols, int tri) {
  constexpr int64_t L = LANES<T>;
  const auto [n0, n1] = used_vectors<T, R>(r, ncols, tri);
  constexpr int64_t NV = std::min(BLK / L, NVB_MAX);  // column vectors per block: the path's registers
  for (int64_t n = n0; n < n1; n += NV)
    tile_nt_span<T, R>(X + r * Dp, YT + n * L, BLK, Dp, C + r * BLK + n * L, std::min(NV, n1 - n));
}

// Rows [r, r + R) of C, the used column vectors within the panel of vectors [p0, p0 + NV) (panel:
// those columns of YT, [Dp, NV * LANES] contiguous).
template <typename T, int64_t R, int64_t NV>
inline void tile_nt_panel_block(const T* X, const T* panel, int64_t Dp, T* C, int64_t r, int64_t ncols, int tri,
                                int64_t p0) {
  constexpr int64_t L = LANES<T>;
  const auto [n0, n1] = used_vectors<T, R>(r, ncols, tri);
  const int64_t a = std::max(n0, p0), b = std::min(n1, p0 + NV);
  if (a < b) tile_nt_span<T, R, NV>(X + r * Dp, panel + (a - p0) * L, NV * L, Dp, C + r * BLK + a * L, b - a);
}

// avx2 (PANELS; NVB_MAX vectors per block): the column slab a block multiplies is
// packed first into a contiguous panel [Dp, NV * LANES], and every row block takes it from there.
// Read in place, the slab is 32-64 bytes of each row of YT, rows BLK values (256 bytes) apart:
// Dp such rows fall on a few cache sets only, where they and the other operands evict each other.
// Each entry is the same sum in the same order as tile_nt_block's: bitwise the same results.
template <typename T>
void tile_nt_panels(const T* __restrict X, const T* __restrict YT, int64_t Dp, T* __restrict C, int64_t rows,
                    int64_t ncols, int tri) {
  constexpr int64_t L = LANES<T>, NV = std::min(BLK / L, NVB_MAX), SW = NV * L;
  thread_local std::vector<T> buffer;
  buffer.resize(Dp * SW);
  T* panel = buffer.data();
  for (int64_t p0 = 0; p0 * L < ncols; p0 += NV) {  // panel p0: column vectors [p0, p0 + NV)
    for (int64_t d = 0; d < Dp; ++d) std::memcpy(panel + d * SW, YT + d * BLK + p0 * L, SW * sizeof(T));
    int64_t r = 0;
    for (; r + RB <= rows; r += RB) tile_nt_panel_block<T, RB, NV>(X, panel, Dp, C, r, ncols, tri, p0);
    if (r + 4 <= rows) tile_nt_panel_block<T, 4, NV>(X, panel, Dp, C, r, ncols, tri, p0), r += 4;
    if (r + 2 <= rows) tile_nt_panel_block<T, 2, NV>(X, panel, Dp, C, r, ncols, tri, p0), r += 2;
    if (r < rows) tile_nt_panel_block<T, 1, NV>(X, panel, Dp, C, r, ncols, tri, p0);
  }
}

// C [rows, BLK] = X [rows, Dp] . YT [Dp, BLK], the entries of columns < ncols that `tri` uses (and
// whatever else shares their vectors): 6 rows at a time, then 4, 2, 1 (6 x 4 accumulators per step,
// 24 FMAs per 10 loads; 4 x 4 gave 16 per 8). avx2: through panels (tile_nt_panels).
template <typename T>
void tile_nt(const T* __restrict X, const T* __restrict YT, int64_t Dp, T* __restrict C, int64_t rows,
             int64_t ncols = BLK, int tri = 0) {
  if constexpr (PANELS) {
    tile_nt_panels(X, YT, Dp, C, rows, ncols, tri);
    return;
  }
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) tile_nt_block<T, RB>(X, YT, Dp, C, r, ncols, tri);
  if (r + 4 <= rows) tile_nt_block<T, 4>(X, YT, Dp, C, r, ncols, tri), r += 4;
  if (r + 2 <= rows) tile_nt_block<T, 2>(X, YT, Dp, C, r, ncols, tri), r += 2;
  if (r < rows) tile_nt_block<T, 1>(X, YT, Dp, C, r, ncols, tri);
}

// Out[i, e0 + e] += sum_{c < cols} PT[c, i] * Z[c, e0 + e] for i < R, e < W * LANES (NN: the weights
// are P[i, c] = PT[i * BLK + c] instead, the same products in the same order).
// (Z: row stride ldz, Out: row stride ldo.)
template <typename T, int64_t R, int64_t W, bool NN>
inline void tile_tn_block(const T* __restrict PT, const T* __restrict Z, int64_t ldz, T* __restrict Out,
                          int64_t ldo, int64_t cols) {
  V<T> acc[R][W];
#pragma GCC unroll 6
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) acc[i][n] = vload(Out + i * ldo + n * LANES<T>);
  for (int64_t c = 0; c < cols; ++c) {
    V<T> z[W];
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) z[n] = vload(Z + c * ldz + n * LANES<T>);
#pragma GCC unroll 6
    for (int64_t i = 0; i < R; ++i) {
      const T p = NN ? PT[i * BLK + c] : PT[c * BLK + i];
#pragma GCC unroll 4
      for (int64_t n = 0; n < W; ++n) acc[i][n] += p * z[n];
    }
  }
#pragma GCC unroll 6
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) vstore(Out + i * ldo + n * LANES<T>, acc[i][n]);
}

template <typename T, int64_t R, bool NN>
inline void tile_tn_rows(const T* PT, const T* Z, int64_t Ep, T* Out, int64_t cols) {
  int64_t e = 0;
  if constexpr (WB >= 4)
    for (; e + 4 * LANES<T> <= Ep; e += 4 * LANES<T>) tile_tn_block<T, R, 4, NN>(PT, Z + e, Ep, Out + e, Ep, cols);
  for (; e + 2 * LANES<T> <= Ep; e += 2 * LANES<T>) tile_tn_block<T, R, 2, NN>(PT, Z + e, Ep, Out + e, Ep, cols);
  for (; e < Ep; e += LANES<T>) tile_tn_block<T, R, 1, NN>(PT, Z + e, Ep, Out + e, Ep, cols);
}

// Rows [r, r + R) of Out: the terms c in [0, cols) that `tri` keeps (LOWER: c <= r + R - 1, UPPER:
// c >= r; the others have weight 0 in every row of the block).
template <typename T, int64_t R, bool NN>
inline void tile_tn_range(const T* PT, const T* Z, int64_t Ep, T* Out, int64_t r, int64_t cols, int tri) {
  const int64_t c0 = tri == UPPER ? std::min(r, cols) : 0, c1 = tri == LOWER ? std::min(cols, r + R) : cols;
  const T* w = NN ? PT + r * BLK + c0 : PT + c0 * BLK + r;
  if (c1 > c0) tile_tn_rows<T, R, NN>(w, Z + c0 * Ep, Ep, Out + r * Ep, c1 - c0);
}

// Rows [r, r + R) of Out's columns [e, e + WB * LANES) from the panel of Z's (tile_tn_panels).
template <typename T, int64_t R, bool NN>
inline void tile_tn_panel_range(const T* PT, const T* panel, T* Out, int64_t Ep, int64_t r, int64_t cols, int tri) {
  constexpr int64_t SW = WB * LANES<T>;
  const int64_t c0 = tri == UPPER ? std::min(r, cols) : 0, c1 = tri == LOWER ? std::min(cols, r + R) : cols;
  const T* w = NN ? PT + r * BLK + c0 : PT + c0 * BLK + r;
  if (c1 > c0) tile_tn_block<T, R, WB, NN>(w, panel + c0 * SW, SW, Out + r * Ep, Ep, c1 - c0);
}

// avx2 (PANELS): Z's column slab of WB vectors is packed first into a contiguous
// panel [cols, WB * LANES] that every row block reads (Z's rows are Ep values apart, 512 bytes at
// Ep = 128: a 32-64-byte slab of each of 64 rows falls on 8 cache sets, and the rows evict each
// other). The same sums in the same order as tile_tn_range's: bitwise the same results.
template <typename T, bool NN>
void tile_tn_panels(const T* __restrict PT, const T* __restrict Z, int64_t Ep, T* __restrict Out, int64_t rows,
                    int64_t cols, int tri) {
  constexpr int64_t SW = WB * LANES<T>;
  static_assert(VEC % SW == 0, "Ep (a multiple of VEC) must split into whole panels");
  alignas(64) T panel[BLK * SW];
  for (int64_t e = 0; e < Ep; e += SW) {
    for (int64_t c = 0; c < cols; ++c) std::memcpy(panel + c * SW, Z + c * Ep + e, SW * sizeof(T));
    int64_t r = 0;
    for (; r + RB <= rows; r += RB) tile_tn_panel_range<T, RB, NN>(PT, panel, Out + e, Ep, r, cols, tri);
    if (r + 4 <= rows) tile_tn_panel_range<T, 4, NN>(PT, panel, Out + e, Ep, r, cols, tri), r += 4;
    if (r + 2 <= rows) tile_tn_panel_range<T, 2, NN>(PT, panel, Out + e, Ep, r, cols, tri), r += 2;
    if (r < rows) tile_tn_panel_range<T, 1, NN>(PT, panel, Out + e, Ep, r, cols, tri);
  }
}

// Out [rows, Ep] += PT[:cols, :rows]^T . Z [cols, Ep]   (PT has row stride BLK), the terms `tri`
// keeps: 6 rows at a time, then 4, 2, 1. NN: the weights are P [rows, cols] (row stride BLK).
// avx2: through panels (tile_tn_panels).
template <typename T, bool NN = false>
void tile_tn_acc(const T* __restrict PT, const T* __restrict Z, int64_t Ep, T* __restrict Out, int64_t rows,
                 int64_t cols, int tri = 0) {
  if constexpr (PANELS) {
    tile_tn_panels<T, NN>(PT, Z, Ep, Out, rows, cols, tri);
    return;
  }
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) tile_tn_range<T, RB, NN>(PT, Z, Ep, Out, r, cols, tri);
  if (r + 4 <= rows) tile_tn_range<T, 4, NN>(PT, Z, Ep, Out, r, cols, tri), r += 4;
  if (r + 2 <= rows) tile_tn_range<T, 2, NN>(PT, Z, Ep, Out, r, cols, tri), r += 2;
  if (r < rows) tile_tn_range<T, 1, NN>(PT, Z, Ep, Out, r, cols, tri);
}

// Out [rows, Ep] += P [rows, cols] . Z [cols, Ep]   (P has row stride BLK): tile_tn_acc without the
// transposed copy of P.
template <typename T>
void tile_nn_acc(const T* P, const T* Z, int64_t Ep, T* Out, int64_t rows, int64_t cols, int tri = 0) {
  tile_tn_acc<T, true>(P, Z, Ep, Out, rows, cols, tri);
}

}  // namespace GRLIB_ISA_NS::hstu
#endif
