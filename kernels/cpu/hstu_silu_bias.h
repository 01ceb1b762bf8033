// Pointwise parts of the jagged HSTU attention (hstu_attention.h): SiLU and its derivative, the bias
// terms added along a row of a score tile, and the bias-table gradients taken from such a row.
// Plain loops over contiguous values, which the compiler vectorises.
#include "isa.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "hstu_tiles.h"

// once per path (isa.h): GRLIB_ISA_NS is the path's namespace
#if defined(GRLIB_ISA_NS) && !defined(GRLIB_HSTU_SILU_BIAS_H)
#define GRLIB_HSTU_SILU_BIAS_H
namespace GRLIB_ISA_NS::hstu {

// exp for float: Cephes' polynomial (max rel. error ~2 ulp), plain arithmetic so that the
// compiler vectorises the loops that call it (libm's expf does not vectorise without -ffast-math,
// and GCC 12 does not vectorise std::floor here: rounding uses the 1.5 * 2^23 trick instead).
// The steps after the clamp, for a float or a vector of floats F: fx = the nearest integer to
// x / ln 2, and e^(x - fx ln 2) by the polynomial (the caller scales by 2^fx).
template <typename F>
inline F exp_reduced(F x, F& fx) {
  fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // nearest integer
  x = x - fx * 0.693359375f + fx * 2.12194440e-4f;
  F y = F{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  return y * x * x + x + 1.0f;
}

inline float fast_exp(float x) {
  float fx;
  const float y = exp_reduced(std::min(std::max(x, -87.3f), 88.7f), fx);
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

// The same bucket through a count of leading zeros: cheaper one at a time (the run search, which
// evaluates a few entries of a row), while the form above vectorises.
inline int64_t time_bucket_one(int64_t dt, int64_t n_buckets) {
  const uint64_t a = static_cast<uint64_t>(dt < 0 ? -dt : dt) + 1;
  const int64_t b = 63 - __builtin_clzll(a);
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
  const T* posr;      // [P] reversed: posr[m] = pos[P - 1 - m]
  const T* time;      // [Bt]
  const int64_t* ts;  // [L] (nullptr without a time bias)
  int64_t P, Bt;
  bool has_pos;
  bool sorted;        // ts is non-decreasing: time buckets are monotone along a tile row (time_runs)
};

// A run [x0, x1) of a tile row on which the time bucket b is constant.
struct Run {
  int64_t x0, x1, b;
};

// The time-bucket runs of one tile row (n = -1: not computed; the row goes entry by entry).
struct TimeRuns {
  Run run[BLK];
  int64_t n = -1;
};

// The maximal runs of [x0, x1) (x1 - x0 <= BLK) on which bucket(tsv[x] - tsc) is constant, in order.
// The bucket must be monotone along x: sorted timestamps on one side of the anchor tsc, which is
// how every pass calls it (the causal part of a row: keys before a query, or queries after a key).
// The first and last entries decide: one bucket, one run; two adjacent buckets, a boundary found by
// bisection (a row far from the diagonal costs a few evaluations, not one per entry); more (rows
// near the diagonal), every entry's bucket (vectorised), then a run starts wherever the bucket
// changes: the starts are compacted without branches (a store per entry, the count advancing only
// at a change), so the cost does not grow with the number of buckets.
inline void time_runs(const int64_t* tsv, int64_t tsc, int64_t x0, int64_t x1, int64_t Bt, TimeRuns& out) {
  out.n = 0;
  if (x0 >= x1) return;
  const int64_t bf = time_bucket_one(tsv[x0] - tsc, Bt), bl = time_bucket_one(tsv[x1 - 1] - tsc, Bt);
  if (bf == bl) {
    out.run[out.n++] = {x0, x1, bf};
  } else if (bf - bl == 1 || bl - bf == 1) {
    int64_t lo = x0 + 1, hi = x1 - 1;  // the first x whose bucket is bl
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (time_bucket_one(tsv[mid] - tsc, Bt) == bf)
        lo = mid + 1;
      else
        hi = mid;
    }
    out.run[out.n++] = {x0, lo, bf};
    out.run[out.n++] = {lo, x1, bl};
  } else {
    int32_t bk[BLK];
    for (int64_t x = x0; x < x1; ++x) bk[x] = static_cast<int32_t>(time_bucket(tsv[x] - tsc, Bt));
    int32_t start[BLK + 1];  // start[0 .. n): the runs' first entries
    int64_t n = 1;
    start[0] = static_cast<int32_t>(x0);
    for (int64_t x = x0 + 1; x < x1; ++x) {
      start[n] = static_cast<int32_t>(x);
      n += bk[x] != bk[x - 1];
    }
    start[n] = static_cast<int32_t>(x1);
    for (int64_t r = 0; r < n; ++r) out.run[r] = {start[r], start[r + 1], bk[start[r]]};
    out.n = n;
  }
}

// s[x] += pos[min(i - j, P - 1)] for x in [x0, x1) along a row where i - j = d0 + SIGN * x >= 0:
// contiguous table entries (the reversed table when SIGN = -1) and the last bucket's constant.
template <int64_t SIGN, typename T>
inline void add_pos(T* __restrict s, int64_t x0, int64_t x1, int64_t d0, const Bias<T>& b) {
  const int64_t last = b.P - 1;
  if constexpr (SIGN > 0) {  // d = d0 + x < last for x < last - d0
    const int64_t xm = std::min(std::max(last - d0, x0), x1);
    const T* __restrict pos = b.pos;
    for (int64_t x = x0; x < xm; ++x) s[x] += pos[d0 + x];
    add_const(s, xm, x1, b.pos[last]);
  } else {  // d = d0 - x >= last for x <= d0 - last; pos[d0 - x] = posr[last - d0 + x]
    const int64_t xm = std::min(std::max(d0 - last + 1, x0), x1);
    add_const(s, x0, xm, b.pos[last]);
    const T* __restrict posr = b.posr;
    for (int64_t x = xm; x < x1; ++x) s[x] += posr[last - d0 + x];
  }
}

// s[x] += bias(i, j) for x in [x0, x1), along a row of a score tile where i - j = d0 + SIGN * x and
// the timestamp gap is tsv[x] - tsc (the time gap's sign does not matter). With sorted timestamps
// the time term is added run by run, and the runs are left in `runs` (when given) for the
// gradients; else bucket by bucket, entry by entry.
template <int64_t SIGN, typename T>
inline void add_bias(T* __restrict s, int64_t x0, int64_t x1, int64_t d0, const Bias<T>& b,
                     const int64_t* __restrict tsv, int64_t tsc, TimeRuns* runs = nullptr) {
  if (b.has_pos) add_pos<SIGN>(s, x0, x1, d0, b);
  if (!b.ts) return;
  const T* time = b.time;
  if (b.sorted) {
    TimeRuns local;
    TimeRuns& r = runs ? *runs : local;
    time_runs(tsv, tsc, x0, x1, b.Bt, r);
    for (int64_t k = 0; k < r.n; ++k) add_const(s, r.run[k].x0, r.run[k].x1, time[r.run[k].b]);
  } else {
    if (runs) runs->n = -1;
    for (int64_t x = x0; x < x1; ++x) s[x] += time[time_bucket(tsv[x] - tsc, b.Bt)];
  }
}

// sum of x[a:b]: lane-wise partial sums, then the lanes and the remainder in order (a fixed order:
// the same result on every run).
template <typename T>
inline T row_sum(const T* x, int64_t a, int64_t b) {
  V<T> acc = {};
  int64_t k = a;
  for (; k + LANES<T> <= b; k += LANES<T>) acc += vload(x + k);
  T sum = 0;
  for (int64_t l = 0; l < LANES<T>; ++l) sum += acc[l];
  for (; k < b; ++k) sum += x[k];
  return sum;
}

// A task's sums of dL/dscores per bias bucket, kept per column of the score tile: a run of a row
// adds to its bucket's row (row[x] += ds[x], a contiguous vector add), and the columns are summed
// once, when the task ends (flush). Summing each run of each row to a scalar instead cost a
// horizontal reduction per run.
template <typename T>
struct BucketColumns {
  T* acc;     // [rows, BLK] (caller's scratch)
  int64_t rows;
  void clear() { std::fill(acc, acc + rows * BLK, T(0)); }
  void add(int64_t row, const T* ds, int64_t x0, int64_t x1) { add_row(acc + row * BLK, ds, x0, x1); }
  T sum(int64_t row) const { return row_sum(acc + row * BLK, 0, BLK); }
};

// fast_exp of every lane of a vector of floats: fast_exp(float)'s steps, in vector registers.
inline V<float> fast_exp(V<float> x) {
  using I = IVec<float>::type;
  x = x < -87.3f ? V<float>{} - 87.3f : x;
  x = 88.7f < x ? V<float>{} + 88.7f : x;
  V<float> fx;
  const V<float> y = exp_reduced(x, fx);
  const I bits = (__builtin_convertvector(fx, I) + 127) << 23;
  V<float> scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// The SiLU loops below use for_vectors (hstu_tiles.h) for float: written as plain loops, GCC
// vectorised fast_exp only on the avx512 path (its masked epilogue); on avx2 and generic the SiLU of
// every score ran one entry at a time (vdivss), as long as the two tile products together (perf,
// 2026-12-04).

// dst[e] = SiLU(src[e]) * scale for e < n, computed in T (dst may be src): whole vectors where S and
// T are float, then the rest one by one; other types one by one.
template <typename S, typename T>
inline void silu_row(const S* src, S* dst, int64_t n, T scale) {
  int64_t e = 0;
  if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>)
    for (; e + LANES<T> <= n; e += LANES<T>) {
      const V<T> x = vload(src + e);
      vstore(dst + e, x * (T(1) / (T(1) + fast_exp(-x))) * scale);
    }
  for (; e < n; ++e) dst[e] = static_cast<S>(silu(static_cast<T>(src[e])) * scale);
}

// dst[e] = scale * g[e] * SiLU'(pre[e]) for e < n (as silu_row).
template <typename T>
inline void silu_grad_row(const T* g, const T* pre, T* dst, int64_t n, T scale) {
  int64_t e = 0;
  if constexpr (std::is_same_v<T, float>)
    for (; e + LANES<T> <= n; e += LANES<T>) {
      const V<T> x = vload(pre + e), sg = T(1) / (T(1) + fast_exp(-x));
      vstore(dst + e, scale * vload(g + e) * (sg * (T(1) + x * (T(1) - sg))));
    }
  for (; e < n; ++e) dst[e] = scale * g[e] * silu_grad(pre[e]);
}

// s[x] <- SiLU(s[x]) * inv_n
template <typename T>
inline void silu_scale(T* __restrict s, int64_t x0, int64_t x1, T inv_n) {
  if constexpr (std::is_same_v<T, float>) {
    for_vectors<T>(x0, x1, [&](int64_t c, const auto& in) {
      const V<T> v = vload(s + c);
      vstore(s + c, in ? v * (T(1) / (T(1) + fast_exp(-v))) * inv_n : v);
    });
  } else {
    for (int64_t x = x0; x < x1; ++x) {
      const T v = s[x];
      s[x] = v * sigmoid(v) * inv_n;
    }
  }
}

// dw[x] <- dL/ds = dw[x] * SiLU'(s[x]) * inv_n
template <typename T>
inline void silu_backward(const T* __restrict s, T* __restrict dw, int64_t x0, int64_t x1, T inv_n) {
  if constexpr (std::is_same_v<T, float>) {
    for_vectors<T>(x0, x1, [&](int64_t c, const auto& in) {
      const V<T> v = vload(s + c), g = vload(dw + c), sg = T(1) / (T(1) + fast_exp(-v));
      vstore(dw + c, in ? g * sg * (T(1) + v * (T(1) - sg)) * inv_n : g);
    });
  } else {
    for (int64_t x = x0; x < x1; ++x) {
      const T v = s[x], sg = sigmoid(v);
      dw[x] = dw[x] * sg * (T(1) + v * (T(1) - sg)) * inv_n;
    }
  }
}

// the same, and s[x] <- SiLU(s[x]) * inv_n in place (the weights, for dV)
template <typename T>
inline void silu_both(T* __restrict s, T* __restrict dw, int64_t x0, int64_t x1, T inv_n) {
  if constexpr (std::is_same_v<T, float>) {
    for_vectors<T>(x0, x1, [&](int64_t c, const auto& in) {
      const V<T> v = vload(s + c), g = vload(dw + c), sg = T(1) / (T(1) + fast_exp(-v));
      vstore(dw + c, in ? g * sg * (T(1) + v * (T(1) - sg)) * inv_n : g);
      vstore(s + c, in ? v * sg * inv_n : v);
    });
  } else {
    for (int64_t x = x0; x < x1; ++x) {
      const T v = s[x], sg = sigmoid(v);
      dw[x] = dw[x] * sg * (T(1) + v * (T(1) - sg)) * inv_n;
      s[x] = v * sg * inv_n;
    }
  }
}

// gtime[bucket(ts[x] - tsc)] += ds[x] for x in [x0, x1) (x < BLK): into the bucket's row of `cols`
// run by run when add_bias left the runs (sorted timestamps); else into gtime, the buckets first
// (vectorised), then run-length sums.
template <typename T>
inline void add_time_grads(const T* ds, const int64_t* ts, int64_t tsc, int64_t x0, int64_t x1, int64_t Bt,
                           T* gtime, const TimeRuns& runs, BucketColumns<T>& cols) {
  if (x0 >= x1) return;
  if (runs.n >= 0) {
    for (int64_t k = 0; k < runs.n; ++k) cols.add(runs.run[k].b, ds, runs.run[k].x0, runs.run[k].x1);
    return;
  }
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

}  // namespace GRLIB_ISA_NS::hstu
#endif
