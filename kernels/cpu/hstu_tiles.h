// SIMD tiles of the jagged HSTU attention (hstu_attention.h): the tile sizes, 64-byte vectors and
// the two register-blocked micro-kernels that every pass multiplies its tiles with.
//
//   tile_nt      C   [rows, BLK]  = X [rows, Dp] . YT [Dp, BLK]          (scores, dL/dweights)
//   tile_tn_acc  Out [rows, Ep]  += PT[:cols, :rows]^T . Z [cols, Ep]     (outputs, gradients)
#pragma once

#include <cstdint>

namespace hstu {

constexpr int64_t BLK = 64;  // query and key tile size (rows of a tile)
constexpr int64_t VEC = 16;  // feature dims are zero-padded to a multiple of this in scratch
constexpr int64_t RB = 6;    // rows per micro-kernel step (register blocking: 6 x 4 accumulators of 32 registers)

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 64-byte vectors through the GCC/Clang vector extension: one AVX-512 register with -march=native
// on such a machine, split into narrower instructions elsewhere. Lanes: 16 floats or 8 doubles.
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <typename T>
using V = typename Vec<T>::type;
template <typename T>
constexpr int64_t LANES = 64 / sizeof(T);

template <typename T>
inline V<T> vload(const T* p) {
  V<T> v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline void vstore(T* p, const V<T>& v) { __builtin_memcpy(p, &v, sizeof(v)); }

// ---- micro-kernels (Dp, Ep: multiples of VEC; tiles have row stride BLK) -----------------------

// C[i, c] = sum_d X[i, d] * YT[d, c] for i < R, c < BLK: R x BLK accumulators stay in registers.
template <typename T, int64_t R>
inline void tile_nt_rows(const T* __restrict X, const T* __restrict YT, int64_t Dp, T* __restrict C) {
  constexpr int64_t NV = BLK / LANES<T>;
  V<T> acc[R][NV] = {};
  for (int64_t d = 0; d < Dp; ++d) {
    V<T> y[NV];
#pragma GCC unroll 8
    for (int64_t n = 0; n < NV; ++n) y[n] = vload(YT + d * BLK + n * LANES<T>);
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

// C [rows, BLK] = X [rows, Dp] . YT [Dp, BLK]: 6 rows at a time, then 4, 2, 1 (6 x 4 accumulators
// per step, 24 FMAs per 10 loads; 4 x 4 gave 16 per 8)
template <typename T>
void tile_nt(const T* __restrict X, const T* __restrict YT, int64_t Dp, T* __restrict C, int64_t rows) {
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) tile_nt_rows<T, RB>(X + r * Dp, YT, Dp, C + r * BLK);
  if (r + 4 <= rows) tile_nt_rows<T, 4>(X + r * Dp, YT, Dp, C + r * BLK), r += 4;
  if (r + 2 <= rows) tile_nt_rows<T, 2>(X + r * Dp, YT, Dp, C + r * BLK), r += 2;
  if (r < rows) tile_nt_rows<T, 1>(X + r * Dp, YT, Dp, C + r * BLK);
}

// Out[i, e0 + e] += sum_{c < cols} PT[c, i] * Z[c, e0 + e] for i < R, e < W * LANES.
template <typename T, int64_t R, int64_t W>
inline void tile_tn_block(const T* __restrict PT, const T* __restrict Z, int64_t Ep, T* __restrict Out,
                          int64_t cols) {
  V<T> acc[R][W];
#pragma GCC unroll 6
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) acc[i][n] = vload(Out + i * Ep + n * LANES<T>);
  for (int64_t c = 0; c < cols; ++c) {
    V<T> z[W];
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) z[n] = vload(Z + c * Ep + n * LANES<T>);
#pragma GCC unroll 6
    for (int64_t i = 0; i < R; ++i) {
      const T p = PT[c * BLK + i];
#pragma GCC unroll 4
      for (int64_t n = 0; n < W; ++n) acc[i][n] += p * z[n];
    }
  }
#pragma GCC unroll 6
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) vstore(Out + i * Ep + n * LANES<T>, acc[i][n]);
}

template <typename T, int64_t R>
inline void tile_tn_rows(const T* PT, const T* Z, int64_t Ep, T* Out, int64_t cols) {
  int64_t e = 0;
  for (; e + 4 * LANES<T> <= Ep; e += 4 * LANES<T>) tile_tn_block<T, R, 4>(PT, Z + e, Ep, Out + e, cols);
  for (; e + 2 * LANES<T> <= Ep; e += 2 * LANES<T>) tile_tn_block<T, R, 2>(PT, Z + e, Ep, Out + e, cols);
  for (; e < Ep; e += LANES<T>) tile_tn_block<T, R, 1>(PT, Z + e, Ep, Out + e, cols);
}

// Out [rows, Ep] += PT[:cols, :rows]^T . Z [cols, Ep]   (PT has row stride BLK): 6 rows at a time,
// then 4, 2, 1
template <typename T>
void tile_tn_acc(const T* __restrict PT, const T* __restrict Z, int64_t Ep, T* __restrict Out, int64_t rows,
                 int64_t cols) {
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) tile_tn_rows<T, RB>(PT + r, Z, Ep, Out + r * Ep, cols);
  if (r + 4 <= rows) tile_tn_rows<T, 4>(PT + r, Z, Ep, Out + r * Ep, cols), r += 4;
  if (r + 2 <= rows) tile_tn_rows<T, 2>(PT + r, Z, Ep, Out + r * Ep, cols), r += 2;
  if (r < rows) tile_tn_rows<T, 1>(PT + r, Z, Ep, Out + r * Ep, cols);
}

}  // namespace hstu
