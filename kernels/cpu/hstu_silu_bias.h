// Pointwise parts of the jagged HSTU attention (hstu_attention.h): SiLU and its derivative, the bias
// terms added along a row of a score tile, and the bias-table gradients taken from such a row.
// Plain loops over contiguous values, which the compiler vectorises.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "hstu_tiles.h"

namespace hstu {

// exp for float: Cephes' polynomial (max rel. error ~2 ulp), plain arithmetic so that the
// compiler vectorises the loops that call it (libm's expf does not vectorise without -ffast-math,
// and GCC 12 does not vectorise std::floor here: rounding uses the 1.5 * 2^23 trick instead).
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.7f);
  const float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // nearest integer
  x = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * x * x + x + 1.0f;
  int32_t bits = (static_cast<int32_t>(fx) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

template <typename T>
inline T sigmoid(T s) { return T(1) / (T(1) + fast_exp(-s)); }

// min(floor(log2(1 + |dt|)), n_buckets - 1), exact for |dt| < 2^53: the binary exponent of the
// (exactly converted) double 1 + |dt|. Plain integer/bit arithmetic, so it vectorises.
inline int64_t time_bucket(int64_t dt, int64_t n_buckets) {
  const double a = static_cast<double>((dt < 0 ? -dt : dt) + 1);
  int64_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  const int64_t b = (bits >> 52) - 1023;
  return b < n_buckets - 1 ? b : n_buckets - 1;
}

// SiLU and its derivative (the fused uvqk op's inputs are pre-activations: SiLU is applied while
// packing, and gradients are multiplied by SiLU' as they are written).
template <typename T>
inline T silu(T x) { return x * sigmoid(x); }
template <typename T>
inline T silu_grad(T x) {
  const T sg = sigmoid(x);
  return sg * (T(1) + x * (T(1) - sg));
}

// The bias tables of one head and the timestamps of one sequence.
template <typename T>
struct Bias {
  const T* pos;       // [P]
  const T* time;      // [Bt]
  const int64_t* ts;  // [L] (nullptr without a time bias)
  int64_t P, Bt;
  bool has_pos;
};

// s[x] += bias(i, j) for x in [x0, x1), along a row of a score tile where i - j = d0 + SIGN * x and
// the timestamp gap is tsv[x] - tsc (the time gap's sign does not matter).
template <int64_t SIGN, typename T>
inline void add_bias(T* __restrict s, int64_t x0, int64_t x1, int64_t d0, const Bias<T>& b,
                     const int64_t* __restrict tsv, int64_t tsc) {
  if (b.has_pos) {
    const T* pos = b.pos;
    const int64_t last = b.P - 1;
    for (int64_t x = x0; x < x1; ++x) {
      const int64_t d = d0 + SIGN * x;
      s[x] += pos[d < last ? d : last];
    }
  }
  if (b.ts) {
    const T* time = b.time;
    for (int64_t x = x0; x < x1; ++x) s[x] += time[time_bucket(tsv[x] - tsc, b.Bt)];
  }
}

// s[x] <- SiLU(s[x]) * inv_n
template <typename T>
inline void silu_scale(T* __restrict s, int64_t x0, int64_t x1, T inv_n) {
  for (int64_t x = x0; x < x1; ++x) {
    const T v = s[x];
    s[x] = v * sigmoid(v) * inv_n;
  }
}

// dw[x] <- dL/ds = dw[x] * SiLU'(s[x]) * inv_n
template <typename T>
inline void silu_backward(const T* __restrict s, T* __restrict dw, int64_t x0, int64_t x1, T inv_n) {
  for (int64_t x = x0; x < x1; ++x) {
    const T v = s[x], sg = sigmoid(v);
    dw[x] = dw[x] * sg * (T(1) + v * (T(1) - sg)) * inv_n;
  }
}

// the same, and s[x] <- SiLU(s[x]) * inv_n in place (the weights, for dV)
template <typename T>
inline void silu_both(T* __restrict s, T* __restrict dw, int64_t x0, int64_t x1, T inv_n) {
  for (int64_t x = x0; x < x1; ++x) {
    const T v = s[x], sg = sigmoid(v);
    dw[x] = dw[x] * sg * (T(1) + v * (T(1) - sg)) * inv_n;
    s[x] = v * sg * inv_n;
  }
}

// gtime[bucket(ts[x] - tsc)] += ds[x] for x in [x0, x1) (x < BLK): the buckets first (vectorised),
// then run-length sums (sorted timestamps give long runs of one bucket along a tile row).
template <typename T>
inline void add_time_grads(const T* ds, const int64_t* ts, int64_t tsc, int64_t x0, int64_t x1, int64_t Bt,
                           T* gtime) {
  if (x0 >= x1) return;
  int64_t bk[BLK];
  for (int64_t x = x0; x < x1; ++x) bk[x] = time_bucket(ts[x] - tsc, Bt);
  int64_t cur = bk[x0];
  T run = 0;
  for (int64_t x = x0; x < x1; ++x) {
    if (bk[x] != cur) {
      gtime[cur] += run;
      run = 0;
      cur = bk[x];
    }
    run += ds[x];
  }
  gtime[cur] += run;
}

}  // namespace hstu
