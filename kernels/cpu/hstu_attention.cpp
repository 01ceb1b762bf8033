// Fused jagged HSTU attention on CPU: forward and backward, no padding, no T x max_len matrix.
//
// For each sequence b (tokens offsets[b] .. offsets[b+1]), head h, query i and key j <= i:
//
//   s_ij = alpha * q_i . k_j + pos_bias[h, min(i - j, P - 1)] + time_bias[h, bucket(t_i - t_j)]
//   out_i = sum_{j <= i} SiLU(s_ij) * v_j / max_len,   bucket(dt) = min(floor(log2(1 + |dt|)), Bt - 1)
//
// The contract and the padded reference (the ground truth) are in grlib/ops/attention.py.
//
// Work is split into tasks: a (sequence, head, tile of 64 queries) in the forward pass and the
// dq pass, a (sequence, head, tile of 64 keys) in the dk/dv pass. Tasks are sorted by cost
// (longest first) and handed out dynamically to the OpenMP workers of at::parallel_for. A task
// packs its own tile transposed once ([D, 64], float32 for float/bf16/half inputs, float64 for
// float64) and walks the tiles it attends to (flash-attention style): each of those is copied
// row-wise into a small per-worker scratch (a cheap contiguous copy), the 64 x 64 score tile
// comes from a register-blocked micro-kernel, bias + SiLU (+ the causal mask on the diagonal
// tile) are applied in place by vectorisable loops, and the tile is multiplied into the task's
// accumulator. Nothing larger than a tile is ever materialised; backward recomputes the scores.
//
// Bias-table gradients are summed into one partial table per task and reduced in task order at
// the end (BiasGrads), so no two threads ever write the same memory and every run gives bitwise
// the same gradients, whatever the scheduling.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t BLK = 64;  // query and key tile size (rows of a tile)
constexpr int64_t VEC = 16;  // feature dims are zero-padded to a multiple of this in scratch
constexpr int64_t RB = 4;    // rows per micro-kernel step (register blocking)

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
#pragma GCC unroll 4
    for (int64_t i = 0; i < R; ++i) {
      const T x = X[i * Dp + d];
#pragma GCC unroll 8
      for (int64_t n = 0; n < NV; ++n) acc[i][n] += x * y[n];
    }
  }
#pragma GCC unroll 4
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int64_t n = 0; n < NV; ++n) vstore(C + i * BLK + n * LANES<T>, acc[i][n]);
}

// C [rows, BLK] = X [rows, Dp] . YT [Dp, BLK]
template <typename T>
void tile_nt(const T* __restrict X, const T* __restrict YT, int64_t Dp, T* __restrict C, int64_t rows) {
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) tile_nt_rows<T, RB>(X + r * Dp, YT, Dp, C + r * BLK);
  for (; r < rows; ++r) tile_nt_rows<T, 1>(X + r * Dp, YT, Dp, C + r * BLK);
}

// Out[i, e0 + e] += sum_{c < cols} PT[c, i] * Z[c, e0 + e] for i < R, e < W * LANES.
template <typename T, int64_t R, int64_t W>
inline void tile_tn_block(const T* __restrict PT, const T* __restrict Z, int64_t Ep, T* __restrict Out,
                          int64_t cols) {
  V<T> acc[R][W];
#pragma GCC unroll 4
  for (int64_t i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) acc[i][n] = vload(Out + i * Ep + n * LANES<T>);
  for (int64_t c = 0; c < cols; ++c) {
    V<T> z[W];
#pragma GCC unroll 4
    for (int64_t n = 0; n < W; ++n) z[n] = vload(Z + c * Ep + n * LANES<T>);
#pragma GCC unroll 4
    for (int64_t i = 0; i < R; ++i) {
      const T p = PT[c * BLK + i];
#pragma GCC unroll 4
      for (int64_t n = 0; n < W; ++n) acc[i][n] += p * z[n];
    }
  }
#pragma GCC unroll 4
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

// Out [rows, Ep] += PT[:cols, :rows]^T . Z [cols, Ep]   (PT has row stride BLK)
template <typename T>
void tile_tn_acc(const T* __restrict PT, const T* __restrict Z, int64_t Ep, T* __restrict Out, int64_t rows,
                 int64_t cols) {
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) tile_tn_rows<T, RB>(PT + r, Z, Ep, Out + r * Ep, cols);
  for (; r < rows; ++r) tile_tn_rows<T, 1>(PT + r, Z, Ep, Out + r * Ep, cols);
}

// ---- packing -------------------------------------------------------------------------------------

// SiLU and its derivative (the fused uvqk op's inputs are pre-activations: SiLU is applied while
// packing, and gradients are multiplied by SiLU' as they are written).
template <typename T>
inline T silu(T x) { return x * sigmoid(x); }
template <typename T>
inline T silu_grad(T x) {
  const T sg = sigmoid(x);
  return sg * (T(1) + x * (T(1) - sg));
}

// n rows of a [T, H, D] tensor (row stride `stride`) -> dst [n, Dp] (times `scale`; of SiLU(x)
// when `act`), zero padded: a contiguous copy per row, then SiLU and the scale in place (plain
// loops over contiguous floats, which the compiler vectorises).
template <typename scalar_t, typename T>
void pack_rows(const scalar_t* src, int64_t stride, int64_t n, int64_t D, int64_t Dp, T scale, T* dst,
               bool act = false) {
  for (int64_t r = 0; r < n; ++r) {
    const scalar_t* s = src + r * stride;
    T* __restrict d = dst + r * Dp;
    for (int64_t e = 0; e < D; ++e) d[e] = static_cast<T>(s[e]);
    if (act)
      for (int64_t e = 0; e < D; ++e) d[e] = silu(d[e]) * scale;
    else if (scale != T(1))
      for (int64_t e = 0; e < D; ++e) d[e] *= scale;
    for (int64_t e = D; e < Dp; ++e) d[e] = T(0);
  }
}

// rows [n, Dp] -> dst [Dp, BLK] transposed, zero padded past n.
template <typename T>
void transpose_rows(const T* __restrict rows, int64_t n, int64_t Dp, T* __restrict dst) {
  std::fill(dst, dst + Dp * BLK, T(0));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < Dp; ++d) dst[d * BLK + r] = rows[r * Dp + d];
}

// n rows of a [T, H, D] tensor -> dst [Dp, BLK] transposed (times `scale`; of SiLU(x) when `act`),
// zero padded; through a per-thread row buffer (pack_rows, then transpose_rows).
template <typename scalar_t, typename T>
void pack_cols(const scalar_t* src, int64_t stride, int64_t n, int64_t D, int64_t Dp, T scale, T* dst,
               bool act = false) {
  thread_local std::vector<T> rows;
  rows.resize(BLK * Dp);
  pack_rows(src, stride, n, D, Dp, scale, rows.data(), act);
  transpose_rows(rows.data(), n, Dp, dst);
}

// One gradient row: dst[e] = scale * val[e] (times SiLU'(pre[e]) when the inputs are pre-activations).
template <typename scalar_t, typename V, typename T>
inline void write_grad(scalar_t* __restrict dst, const V* __restrict val, int64_t n, T scale,
                       const scalar_t* __restrict pre) {
  if (pre)
    for (int64_t e = 0; e < n; ++e)
      dst[e] = static_cast<scalar_t>(scale * static_cast<T>(val[e]) * silu_grad(static_cast<T>(pre[e])));
  else
    for (int64_t e = 0; e < n; ++e) dst[e] = static_cast<scalar_t>(scale * static_cast<T>(val[e]));
}

struct Task {
  int64_t b, h, blk, cost;
};

// Every (sequence, head, tile) with its cost in tile pairs; `by_key` = cost of a key tile.
std::vector<Task> make_tasks(const int64_t* o, int64_t B, int64_t H, bool by_key) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = (o[b + 1] - o[b] + BLK - 1) / BLK;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < H; ++h) tasks.push_back({b, h, t, by_key ? n - t : t + 1});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return tasks;
}

// One task per (sequence, head) of a non-empty sequence, costing its tile pairs n (n + 1) / 2,
// longest first: the tasks of the one-pass backward.
std::vector<Task> sequence_tasks(const int64_t* o, int64_t B, int64_t H) {
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = (o[b + 1] - o[b] + BLK - 1) / BLK;
    if (n > 0)
      for (int64_t h = 0; h < H; ++h) tasks.push_back({b, h, 0, n * (n + 1) / 2});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& x, const Task& y) { return x.cost > y.cost; });
  return tasks;
}

// Runs fn(worker, task) for every task, longest first, dynamically balanced over the workers of
// at::parallel_for (one index per worker; nested calls run serially on worker 0).
template <typename F>
void run_tasks(const std::vector<Task>& tasks, int64_t workers, const F& fn) {
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, workers, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w)
      for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) fn(w, tasks[t]);
  });
}

// The inputs of one call, checked and made contiguous.
struct Args {
  at::Tensor q, k, v, offsets, pos, time, ts;
  int64_t T, H, D, Dv, B, P, Bt, max_len;
  int64_t rq, rk, rv;  // row strides (elements) of q, k, v: views such as the chunks of a [T, 4d] tensor need no copy
  bool has_pos, has_time;
  bool act = false;  // q, k, v are pre-activations: the attention reads SiLU(q), SiLU(k), SiLU(v)
};

// t [T, H, D] itself when each row holds its H x D values densely (stride(2) == 1, stride(1) == D),
// whatever the row stride; a contiguous copy otherwise.
at::Tensor dense_rows(const at::Tensor& t) {
  const bool dense = t.stride(2) == 1 && (t.size(1) <= 1 || t.stride(1) == t.size(2)) && t.stride(0) >= 0;
  return dense ? t : t.contiguous();
}

Args check_args(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& offsets, int64_t max_len, const std::optional<at::Tensor>& pos_bias,
                const std::optional<at::Tensor>& time_bias, const std::optional<at::Tensor>& timestamps) {
  for (const auto* t : {&q, &k, &v, &offsets})
    TORCH_CHECK(t->device().is_cpu(), op, ": every input must be a CPU tensor, got ", t->device());
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes(), op, ": q and k must both be [T, H, Dqk], got ",
              q.sizes(), " and ", k.sizes());
  TORCH_CHECK(v.dim() == 3 && v.size(0) == q.size(0) && v.size(1) == q.size(1), op,
              ": v must be [T=", q.size(0), ", H=", q.size(1), ", Dv], got ", v.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), op,
              ": q, k, v must share one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), op, ": q, k, v must be floating point, got ",
              q.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong && offsets.numel() >= 1, op,
              ": offsets must be a 1-D int64 tensor of B+1 >= 1 entries, got ", offsets.sizes(), " ",
              offsets.scalar_type());
  TORCH_CHECK(max_len >= 1, op, ": max_len must be >= 1, got ", max_len);
  Args a;
  a.q = dense_rows(q);
  a.k = dense_rows(k);
  a.v = dense_rows(v);
  a.rq = a.q.stride(0), a.rk = a.k.stride(0), a.rv = a.v.stride(0);
  a.offsets = offsets.contiguous();
  a.T = q.size(0), a.H = q.size(1), a.D = q.size(2), a.Dv = v.size(2), a.B = offsets.numel() - 1;
  a.max_len = max_len;
  const int64_t* o = a.offsets.data_ptr<int64_t>();
  TORCH_CHECK(o[0] == 0, op, ": offsets[0] must be 0, got ", o[0]);
  for (int64_t b = 0; b < a.B; ++b) {
    TORCH_CHECK(o[b + 1] >= o[b], op, ": offsets must be non-decreasing, offsets[", b + 1, "]=", o[b + 1],
                " < offsets[", b, "]=", o[b]);
    TORCH_CHECK(o[b + 1] - o[b] <= max_len, op, ": sequence ", b, " has ", o[b + 1] - o[b],
                " tokens, more than max_len=", max_len, " (truncate the batch first)");
  }
  TORCH_CHECK(o[a.B] == a.T, op, ": offsets[-1]=", o[a.B], " must equal the number of tokens T=", a.T);
  a.has_pos = pos_bias.has_value() && pos_bias->defined();
  a.has_time = time_bias.has_value() && time_bias->defined();
  a.P = a.Bt = 1;
  if (a.has_pos) {
    const auto& t = *pos_bias;
    TORCH_CHECK(t.device().is_cpu() && at::isFloatingType(t.scalar_type()) && t.dim() == 2 &&
                    t.size(0) == a.H && t.size(1) >= 1,
                op, ": pos_bias must be a floating CPU tensor [H=", a.H, ", buckets >= 1], got ", t.sizes(),
                " ", t.scalar_type());
    a.pos = t.contiguous();
    a.P = t.size(1);
  }
  if (a.has_time) {
    const auto& t = *time_bias;
    TORCH_CHECK(t.device().is_cpu() && at::isFloatingType(t.scalar_type()) && t.dim() == 2 &&
                    t.size(0) == a.H && t.size(1) >= 1,
                op, ": time_bias must be a floating CPU tensor [H=", a.H, ", buckets >= 1], got ", t.sizes(),
                " ", t.scalar_type());
    TORCH_CHECK(timestamps.has_value() && timestamps->defined(), op, ": time_bias needs timestamps");
    const auto& s = *timestamps;
    TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kLong && s.dim() == 1 && s.size(0) == a.T, op,
                ": timestamps must be a 1-D int64 CPU tensor of T=", a.T, " entries, got ", s.sizes(), " ",
                s.scalar_type());
    a.time = t.contiguous();
    a.ts = s.contiguous();
    a.Bt = t.size(1);
  }
  return a;
}

// Per-head bias tables in the compute type (zeros when absent: adding 0 changes nothing).
template <typename T>
std::vector<T> table(const at::Tensor& t, bool has, int64_t H, int64_t n) {
  std::vector<T> out(H * n, T(0));
  if (has) {
    const at::Tensor c = t.to(c10::CppTypeToScalarType<T>::value).contiguous();
    std::copy(c.data_ptr<T>(), c.data_ptr<T>() + H * n, out.begin());
  }
  return out;
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

// Per-worker scratch of `n` elements each.
template <typename T>
std::vector<std::vector<T>> scratch(int64_t workers, int64_t n) {
  return std::vector<std::vector<T>>(workers, std::vector<T>(n));
}

// Everything a pass needs, in the compute type T.
template <typename scalar_t>
struct Pass {
  using T = at::opmath_type<scalar_t>;
  const Args& a;
  int64_t H, D, Dv, Dp, Dvp, hsv;
  const int64_t* o;
  const int64_t* ts;
  std::vector<T> pos, time;
  T alpha, inv_n;

  Pass(const Args& args, double alpha_in)
      : a(args), H(args.H), D(args.D), Dv(args.Dv), Dp(round_up(args.D, VEC)), Dvp(round_up(args.Dv, VEC)),
        hsv(args.H * args.Dv), o(args.offsets.data_ptr<int64_t>()),
        ts(args.has_time ? args.ts.data_ptr<int64_t>() : nullptr), pos(table<T>(args.pos, args.has_pos, H, args.P)),
        time(table<T>(args.time, args.has_time, H, args.Bt)), alpha(static_cast<T>(alpha_in)),
        inv_n(T(1) / static_cast<T>(args.max_len)) {}

  Bias<T> bias(int64_t b, int64_t h) const {
    return {pos.data() + h * a.P, time.data() + h * a.Bt, ts ? ts + o[b] : nullptr, a.P, a.Bt, a.has_pos};
  }
  int64_t workers(size_t tasks) const {
    return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tasks)));
  }
};

// Per-task partial bias-table gradients, reduced in task order after the pass: the sums do not
// depend on which worker ran which task (no races, and bitwise the same result on every run).
template <typename T>
struct BiasGrads {
  int64_t P, Bt;
  std::vector<T> partial;  // [tasks, P + Bt]
  BiasGrads(size_t tasks, int64_t P_, int64_t Bt_) : P(P_), Bt(Bt_), partial(tasks * (P_ + Bt_), T(0)) {}
  T* pos(int64_t task) { return partial.data() + task * (P + Bt); }
  T* time(int64_t task) { return pos(task) + P; }
  // -> dpos [H, P], dtime [H, Bt] (each copied when its table exists)
  void reduce(const std::vector<Task>& tasks, const Args& a, at::Tensor& dpos, at::Tensor& dtime) const {
    std::vector<T> sum(a.H * (P + Bt), T(0));  // [H, P] then [H, Bt]
    for (size_t i = 0; i < tasks.size(); ++i) {
      const T* src = partial.data() + i * (P + Bt);
      T *sp = sum.data() + tasks[i].h * P, *st = sum.data() + a.H * P + tasks[i].h * Bt;
      for (int64_t e = 0; e < P; ++e) sp[e] += src[e];
      for (int64_t e = 0; e < Bt; ++e) st[e] += src[P + e];
    }
    auto reduced = at::from_blob(sum.data(), {a.H * (P + Bt)},
                                 at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
    if (a.has_pos) dpos.copy_(reduced.narrow(0, 0, a.H * P).view({a.H, P}));
    if (a.has_time) dtime.copy_(reduced.narrow(0, a.H * P, a.H * Bt).view({a.H, Bt}));
  }
};

template <typename scalar_t>
at::Tensor forward_impl(const Args& a, double alpha_in) {
  using T = at::opmath_type<scalar_t>;
  const Pass<scalar_t> p(a, alpha_in);
  const int64_t Dp = p.Dp, Dvp = p.Dvp, D = p.D, Dv = p.Dv, hsv = p.hsv;
  auto out = at::empty({a.T, a.H, a.Dv}, a.q.options());
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
  scalar_t* y = out.data_ptr<scalar_t>();
  const auto tasks = make_tasks(p.o, a.B, a.H, /*by_key=*/false);
  const int64_t workers = p.workers(tasks.size());
  // per worker: QT [Dp, BLK], K [BLK, Dp], V [BLK, Dvp], ST [BLK, BLK], O [BLK, Dvp]
  auto bufs = scratch<T>(workers, BLK * (3 * Dp + 2 * Dvp + BLK));
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *QT = bufs[w].data(), *Ks = QT + Dp * BLK, *Vs = Ks + BLK * Dp, *ST = Vs + BLK * Dvp, *O = ST + BLK * BLK;
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base, i0 = t.blk * BLK, nq = std::min(BLK, L - i0);
    const Bias<T> bias = p.bias(t.b, t.h);
    const int64_t* tsq = bias.ts ? bias.ts + i0 : nullptr;
    pack_cols(q + (base + i0) * a.rq + t.h * D, a.rq, nq, D, Dp, p.alpha, QT, a.act);
    std::fill(O, O + nq * Dvp, T(0));
    for (int64_t j0 = 0; j0 < i0 + nq; j0 += BLK) {
      const int64_t nk = std::min(BLK, i0 + nq - j0);
      pack_rows(k + (base + j0) * a.rk + t.h * D, a.rk, nk, D, Dp, T(1), Ks, a.act);
      pack_rows(v + (base + j0) * a.rv + t.h * Dv, a.rv, nk, Dv, Dvp, T(1), Vs, a.act);
      tile_nt(Ks, QT, Dp, ST, nk);  // ST [key c, query r] = alpha k_j . q_i
      for (int64_t c = 0; c < nk; ++c) {  // weights^T; zero where j > i (r < first)
        const int64_t j = j0 + c, first = std::min(std::max<int64_t>(0, j - i0), nq);
        T* s = ST + c * BLK;
        add_bias<1>(s, first, nq, i0 - j, bias, tsq, bias.ts ? bias.ts[j] : 0);
        silu_scale(s, first, nq, p.inv_n);
        std::fill(s, s + first, T(0));
      }
      tile_tn_acc(ST, Vs, Dvp, O, nq, nk);  // O += W V
    }
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t e = 0; e < Dv; ++e) y[(base + i0 + r) * hsv + t.h * Dv + e] = static_cast<scalar_t>(O[r * Dvp + e]);
  });
  return out;
}

// dq and the bias-table gradients: one task per (sequence, head, query tile).
template <typename scalar_t>
void backward_dq(const Args& a, double alpha_in, const at::Tensor& grad, at::Tensor& dq, at::Tensor& dpos,
                 at::Tensor& dtime) {
  using T = at::opmath_type<scalar_t>;
  const Pass<scalar_t> p(a, alpha_in);
  const int64_t Dp = p.Dp, Dvp = p.Dvp, D = p.D, Dv = p.Dv, P = a.P, Bt = a.Bt;
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
  const scalar_t* g = grad.data_ptr<scalar_t>();
  const int64_t rg = grad.stride(0);  // row stride of dO
  scalar_t* gq = dq.data_ptr<scalar_t>();
  const int64_t oq = dq.stride(0);  // row stride of dq (a column block of dz in the fused uvqk op)
  const auto tasks = make_tasks(p.o, a.B, a.H, /*by_key=*/false);
  const int64_t workers = p.workers(tasks.size());
  // per worker: QT [Dp, BLK], dOT [Dvp, BLK], K [BLK, Dp], V [BLK, Dvp], ST, dWT [BLK, BLK],
  // dQ [BLK, Dp]
  const int64_t tile = BLK * (3 * Dp + 2 * Dvp + 2 * BLK);
  auto bufs = scratch<T>(workers, tile);
  BiasGrads<T> bias_grads(tasks.size(), P, Bt);
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *QT = bufs[w].data(), *dOT = QT + Dp * BLK, *Ks = dOT + Dvp * BLK, *Vs = Ks + BLK * Dp, *ST = Vs + BLK * Dvp;
    T *dWT = ST + BLK * BLK, *dQ = dWT + BLK * BLK;
    const int64_t task = &t - tasks.data();
    T *gpos = bias_grads.pos(task), *gtime = bias_grads.time(task);
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base, i0 = t.blk * BLK, nq = std::min(BLK, L - i0);
    const Bias<T> bias = p.bias(t.b, t.h);
    const int64_t* tsq = bias.ts ? bias.ts + i0 : nullptr;
    pack_cols(q + (base + i0) * a.rq + t.h * D, a.rq, nq, D, Dp, p.alpha, QT, a.act);
    pack_cols(g + (base + i0) * rg + t.h * Dv, rg, nq, Dv, Dvp, T(1), dOT);
    std::fill(dQ, dQ + nq * Dp, T(0));
    for (int64_t j0 = 0; j0 < i0 + nq; j0 += BLK) {
      const int64_t nk = std::min(BLK, i0 + nq - j0);
      pack_rows(k + (base + j0) * a.rk + t.h * D, a.rk, nk, D, Dp, T(1), Ks, a.act);
      pack_rows(v + (base + j0) * a.rv + t.h * Dv, a.rv, nk, Dv, Dvp, T(1), Vs, a.act);
      tile_nt(Ks, QT, Dp, ST, nk);    // scores^T [key, query]
      tile_nt(Vs, dOT, Dvp, dWT, nk);  // (dO V^T)^T = dL/dweights^T
      for (int64_t c = 0; c < nk; ++c) {  // dWT <- dL/dscores^T; bias gradients
        const int64_t j = j0 + c, first = std::min(std::max<int64_t>(0, j - i0), nq);
        const int64_t tsj = bias.ts ? bias.ts[j] : 0;
        T *s = ST + c * BLK, *ds = dWT + c * BLK;
        add_bias<1>(s, first, nq, i0 - j, bias, tsq, tsj);
        silu_backward<T>(s, ds, first, nq, p.inv_n);
        std::fill(ds, ds + first, T(0));
        if (a.has_pos) {  // i - j = i0 - j + r: one bucket each below P - 1, the rest share the last
          const int64_t clamp = std::min(std::max(first, P - 1 - (i0 - j)), nq);
          for (int64_t r = first; r < clamp; ++r) gpos[i0 - j + r] += ds[r];
          T tail = 0;
          for (int64_t r = clamp; r < nq; ++r) tail += ds[r];
          gpos[P - 1] += tail;
        }
        if (tsq) add_time_grads(ds, tsq, tsj, first, nq, Bt, gtime);
      }
      tile_tn_acc(dWT, Ks, Dp, dQ, nq, nk);  // dQ += dS K
    }
    for (int64_t r = 0; r < nq; ++r)
      write_grad(gq + (base + i0 + r) * oq + t.h * D, dQ + r * Dp, D, p.alpha,
                 a.act ? q + (base + i0 + r) * a.rq + t.h * D : nullptr);
  });
  bias_grads.reduce(tasks, a, dpos, dtime);
}

// dk and dv: one task per (sequence, head, key tile), walking the query tiles at or after it.
template <typename scalar_t>
void backward_dkv(const Args& a, double alpha_in, const at::Tensor& grad, at::Tensor& dk, at::Tensor& dv) {
  using T = at::opmath_type<scalar_t>;
  const Pass<scalar_t> p(a, alpha_in);
  const int64_t Dp = p.Dp, Dvp = p.Dvp, D = p.D, Dv = p.Dv;
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
  const scalar_t* g = grad.data_ptr<scalar_t>();
  const int64_t rg = grad.stride(0);  // row stride of dO
  scalar_t *gk = dk.data_ptr<scalar_t>(), *gv = dv.data_ptr<scalar_t>();
  const int64_t ok = dk.stride(0), ov = dv.stride(0);
  const auto tasks = make_tasks(p.o, a.B, a.H, /*by_key=*/true);
  const int64_t workers = p.workers(tasks.size());
  // per worker: KT [Dp, BLK], VT [Dvp, BLK], Q [BLK, Dp], dO [BLK, Dvp], S, dW [BLK, BLK],
  // dK [BLK, Dp], dV [BLK, Dvp]
  auto bufs = scratch<T>(workers, BLK * (3 * Dp + 3 * Dvp + 2 * BLK));
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *KT = bufs[w].data(), *VT = KT + Dp * BLK, *Qs = VT + Dvp * BLK, *dOs = Qs + BLK * Dp, *S = dOs + BLK * Dvp;
    T *dW = S + BLK * BLK, *dK = dW + BLK * BLK, *dV = dK + BLK * Dp;
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base, j0 = t.blk * BLK, nk = std::min(BLK, L - j0);
    const Bias<T> bias = p.bias(t.b, t.h);
    const int64_t* tsk = bias.ts ? bias.ts + j0 : nullptr;
    pack_cols(k + (base + j0) * a.rk + t.h * D, a.rk, nk, D, Dp, p.alpha, KT, a.act);
    pack_cols(v + (base + j0) * a.rv + t.h * Dv, a.rv, nk, Dv, Dvp, T(1), VT, a.act);
    std::fill(dK, dK + nk * Dp, T(0));
    std::fill(dV, dV + nk * Dvp, T(0));
    for (int64_t i0 = j0; i0 < L; i0 += BLK) {
      const int64_t nq = std::min(BLK, L - i0);
      pack_rows(q + (base + i0) * a.rq + t.h * D, a.rq, nq, D, Dp, T(1), Qs, a.act);
      pack_rows(g + (base + i0) * rg + t.h * Dv, rg, nq, Dv, Dvp, T(1), dOs);
      tile_nt(Qs, KT, Dp, S, nq);    // scores [query, key]
      tile_nt(dOs, VT, Dvp, dW, nq);  // dO V^T
      for (int64_t r = 0; r < nq; ++r) {  // S <- weights, dW <- dL/dscores; zero where j > i
        const int64_t i = i0 + r, valid = std::min(nk, i - j0 + 1);
        T *s = S + r * BLK, *ds = dW + r * BLK;
        add_bias<-1>(s, 0, valid, i - j0, bias, tsk, bias.ts ? bias.ts[i] : 0);
        silu_both<T>(s, ds, 0, valid, p.inv_n);
        std::fill(s + valid, s + nk, T(0));
        std::fill(ds + valid, ds + nk, T(0));
      }
      tile_tn_acc(S, dOs, Dvp, dV, nk, nq);  // dV += W^T dO
      tile_tn_acc(dW, Qs, Dp, dK, nk, nq);   // dK += dS^T Q
    }
    for (int64_t c = 0; c < nk; ++c) {
      write_grad(gk + (base + j0 + c) * ok + t.h * D, dK + c * Dp, D, p.alpha,
                 a.act ? k + (base + j0 + c) * a.rk + t.h * D : nullptr);
      write_grad(gv + (base + j0 + c) * ov + t.h * Dv, dV + c * Dvp, Dv, T(1),
                 a.act ? v + (base + j0 + c) * a.rv + t.h * Dv : nullptr);
    }
  });
}

// dq, dk, dv and the bias-table gradients in one pass: one task per (sequence, head). The task
// packs the sequence's Q (times alpha) and dO rows once, then walks its key tiles j and, for each,
// the query tiles i >= j: the score and dL/dweight tiles are computed once per pair (the two-pass
// form computes them twice), and dV_j, dK_j and dQ_i are all accumulated from them (5 tile
// products per pair instead of 7). Needs a task per (sequence, head), so it is chosen when those
// tasks balance over the workers (see run_backward).
template <typename scalar_t>
void backward_single(const Args& a, double alpha_in, const at::Tensor& grad, at::Tensor& dq, at::Tensor& dk,
                     at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime) {
  using T = at::opmath_type<scalar_t>;
  const Pass<scalar_t> p(a, alpha_in);
  const int64_t Dp = p.Dp, Dvp = p.Dvp, D = p.D, Dv = p.Dv, P = a.P, Bt = a.Bt;
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
  const scalar_t* g = grad.data_ptr<scalar_t>();
  const int64_t rg = grad.stride(0);  // row stride of dO
  scalar_t *gq = dq.data_ptr<scalar_t>(), *gk = dk.data_ptr<scalar_t>(), *gv = dv.data_ptr<scalar_t>();
  const int64_t oq = dq.stride(0), ok = dk.stride(0), ov = dv.stride(0);
  const std::vector<Task> tasks = sequence_tasks(p.o, a.B, a.H);
  int64_t longest = 0;
  for (int64_t b = 0; b < a.B; ++b) longest = std::max(longest, p.o[b + 1] - p.o[b]);
  const int64_t workers = p.workers(tasks.size()), Lp = round_up(longest, BLK);
  // per worker: Q [Lp, Dp], dO [Lp, Dvp], dQ [Lp, Dp] (the whole sequence); KT [Dp, BLK], K [BLK, Dp],
  // VT [Dvp, BLK], dK [BLK, Dp], dV [BLK, Dvp]; S, dW, dST [BLK, BLK]
  const int64_t seq = Lp * (2 * Dp + Dvp), tile = seq + BLK * (3 * Dp + 2 * Dvp + 3 * BLK);
  auto bufs = scratch<T>(workers, tile);
  BiasGrads<T> bias_grads(tasks.size(), P, Bt);
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *Qs = bufs[w].data(), *dOs = Qs + Lp * Dp, *dQ = dOs + Lp * Dvp, *KT = dQ + Lp * Dp, *Ks = KT + Dp * BLK;
    T *VT = Ks + BLK * Dp, *dK = VT + Dvp * BLK, *dV = dK + BLK * Dp, *S = dV + BLK * Dvp, *dW = S + BLK * BLK;
    T *dST = dW + BLK * BLK;
    const int64_t task = &t - tasks.data();
    T *gpos = bias_grads.pos(task), *gtime = bias_grads.time(task);
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base;
    const Bias<T> bias = p.bias(t.b, t.h);
    pack_rows(q + base * a.rq + t.h * D, a.rq, L, D, Dp, p.alpha, Qs, a.act);
    pack_rows(g + base * rg + t.h * Dv, rg, L, Dv, Dvp, T(1), dOs);
    std::fill(dQ, dQ + L * Dp, T(0));
    for (int64_t j0 = 0; j0 < L; j0 += BLK) {
      const int64_t nk = std::min(BLK, L - j0);
      const int64_t* tsk = bias.ts ? bias.ts + j0 : nullptr;
      pack_rows(k + (base + j0) * a.rk + t.h * D, a.rk, nk, D, Dp, T(1), Ks, a.act);
      transpose_rows(Ks, nk, Dp, KT);
      pack_cols(v + (base + j0) * a.rv + t.h * Dv, a.rv, nk, Dv, Dvp, T(1), VT, a.act);
      std::fill(dK, dK + nk * Dp, T(0));
      std::fill(dV, dV + nk * Dvp, T(0));
      for (int64_t i0 = j0; i0 < L; i0 += BLK) {
        const int64_t nq = std::min(BLK, L - i0);
        T *Qi = Qs + i0 * Dp, *dOi = dOs + i0 * Dvp;
        tile_nt(Qi, KT, Dp, S, nq);    // scores [query, key] = alpha q_i . k_j
        tile_nt(dOi, VT, Dvp, dW, nq);  // dL/dweights = dO V^T
        for (int64_t r = 0; r < nq; ++r) {  // S <- weights, dW <- dL/dscores; zero where j > i
          const int64_t i = i0 + r, valid = std::min(nk, i - j0 + 1), tsi = bias.ts ? bias.ts[i] : 0;
          T *s = S + r * BLK, *ds = dW + r * BLK;
          add_bias<-1>(s, 0, valid, i - j0, bias, tsk, tsi);
          silu_both<T>(s, ds, 0, valid, p.inv_n);
          std::fill(s + valid, s + nk, T(0));
          std::fill(ds + valid, ds + nk, T(0));
          if (a.has_pos) {  // i - j = (i - j0) - c: the first keys may share the last bucket
            const int64_t tail = std::min(valid, std::max<int64_t>(0, i - j0 - (P - 1) + 1));
            T sum = 0;
            for (int64_t c = 0; c < tail; ++c) sum += ds[c];
            gpos[P - 1] += sum;
            for (int64_t c = tail; c < valid; ++c) gpos[i - j0 - c] += ds[c];
          }
          if (tsk) add_time_grads(ds, tsk, tsi, 0, valid, Bt, gtime);
        }
        tile_tn_acc(S, dOi, Dvp, dV, nk, nq);  // dV_j += W^T dO_i
        tile_tn_acc(dW, Qi, Dp, dK, nk, nq);   // dK_j += dS^T (alpha Q_i)
        for (int64_t c = 0; c < nk; ++c)       // dST [key, query] = dS^T
          for (int64_t r = 0; r < nq; ++r) dST[c * BLK + r] = dW[r * BLK + c];
        tile_tn_acc(dST, Ks, Dp, dQ + i0 * Dp, nq, nk);  // dQ_i += dS K_j
      }
      for (int64_t c = 0; c < nk; ++c) {
        write_grad(gk + (base + j0 + c) * ok + t.h * D, dK + c * Dp, D, T(1),
                   a.act ? k + (base + j0 + c) * a.rk + t.h * D : nullptr);
        write_grad(gv + (base + j0 + c) * ov + t.h * Dv, dV + c * Dvp, Dv, T(1),
                   a.act ? v + (base + j0 + c) * a.rv + t.h * Dv : nullptr);
      }
    }
    for (int64_t r = 0; r < L; ++r)
      write_grad(gq + (base + r) * oq + t.h * D, dQ + r * Dp, D, p.alpha, a.act ? q + (base + r) * a.rq + t.h * D : nullptr);
  });
  bias_grads.reduce(tasks, a, dpos, dtime);
}

// Auto mode: one pass when its (sequence, head) tasks can keep every worker busy, i.e. the costliest
// holds at most 1 / workers of the tile pairs (longest-first dynamic scheduling then balances them);
// else the two passes, whose tasks are single tiles (e.g. one long sequence with one head).
// mode: 0 auto, 1 one pass (backward_single), 2 two passes (backward_dq + backward_dkv).
template <typename scalar_t>
void run_backward(const char* op, int64_t mode, const Args& a, double alpha, const at::Tensor& grad, at::Tensor& dq,
                  at::Tensor& dk, at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime) {
  TORCH_CHECK(mode >= 0 && mode <= 2, op, ": mode must be 0 (auto), 1 (one pass) or 2 (two passes), got ", mode);
  bool single = mode == 1;
  if (mode == 0) {
    const std::vector<Task> tasks = sequence_tasks(a.offsets.data_ptr<int64_t>(), a.B, a.H);
    int64_t total = 0;
    for (const Task& t : tasks) total += t.cost;
    single = tasks.empty() || tasks.front().cost * at::get_num_threads() <= total;
  }
  if (single) {
    backward_single<scalar_t>(a, alpha, grad, dq, dk, dv, dpos, dtime);
  } else {
    backward_dq<scalar_t>(a, alpha, grad, dq, dpos, dtime);
    backward_dkv<scalar_t>(a, alpha, grad, dk, dv);
  }
}

}  // namespace

// q, k [T, H, Dqk], v [T, H, Dv], offsets [B+1] -> out [T, H, Dv]
at::Tensor hstu_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& offsets, int64_t max_len, double alpha,
                              const std::optional<at::Tensor>& pos_bias, const std::optional<at::Tensor>& time_bias,
                              const std::optional<at::Tensor>& timestamps) {
  const Args a = check_args("hstu_attention", q, k, v, offsets, max_len, pos_bias, time_bias, timestamps);
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.q.scalar_type(), "hstu_attention", [&] {
    out = forward_impl<scalar_t>(a, alpha);
  });
  return out;
}

// -> (dq, dk, dv, dpos_bias, dtime_bias); a bias gradient is an empty [0] tensor when its table is absent.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> hstu_attention_bwd(
    const at::Tensor& grad_in, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& offsets, int64_t max_len, double alpha, const std::optional<at::Tensor>& pos_bias,
    const std::optional<at::Tensor>& time_bias, const std::optional<at::Tensor>& timestamps, int64_t mode) {
  const Args a = check_args("hstu_attention_backward", q, k, v, offsets, max_len, pos_bias, time_bias, timestamps);
  TORCH_CHECK(grad_in.device().is_cpu() && grad_in.dim() == 3 && grad_in.size(0) == a.T && grad_in.size(1) == a.H &&
                  grad_in.size(2) == a.Dv && grad_in.scalar_type() == a.q.scalar_type(),
              "hstu_attention_backward: grad must be a ", a.q.scalar_type(), " CPU tensor [T=", a.T, ", H=", a.H,
              ", Dv=", a.Dv, "], got ", grad_in.sizes(), " ", grad_in.scalar_type());
  auto grad = dense_rows(grad_in);
  // contiguous [T, H, D] gradients (the inputs may be strided views)
  auto dq = at::empty({a.T, a.H, a.D}, a.q.options()), dk = at::empty({a.T, a.H, a.D}, a.q.options());
  auto dv = at::empty({a.T, a.H, a.Dv}, a.q.options());
  auto dpos = a.has_pos ? at::empty_like(a.pos) : at::empty({0}, a.q.options());
  auto dtime = a.has_time ? at::empty_like(a.time) : at::empty({0}, a.q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.q.scalar_type(), "hstu_attention_backward", [&] {
    run_backward<scalar_t>("hstu_attention_backward", mode, a, alpha, grad, dq, dk, dv, dpos, dtime);
  });
  return {dq, dk, dv, dpos, dtime};
}

// ---- HSTU's SiLU, split and attention fused: z [T, 4d] = the uvqk projection (columns u | v | q | k) --

namespace {

// Column block i of z [T, 4d] as a [T, H, d / H] view (row stride 4d).
at::Tensor block(const at::Tensor& z, int64_t i, int64_t H) {
  const int64_t d = z.size(1) / 4;
  return z.narrow(1, i * d, d).view({z.size(0), H, d / H});
}

at::Tensor check_uvqk(const char* op, const at::Tensor& z, int64_t H) {
  TORCH_CHECK(z.device().is_cpu() && z.dim() == 2 && at::isFloatingType(z.scalar_type()), op,
              ": z must be a floating CPU tensor [T, 4d], got ", z.sizes(), " ", z.scalar_type());
  TORCH_CHECK(H >= 1 && z.size(1) > 0 && z.size(1) % (4 * H) == 0, op, ": z's width (", z.size(1),
              ") must be 4 x n_heads (", H, ") x head dim");
  return z.stride(1) == 1 ? z : z.contiguous();
}

}  // namespace

// z [T, 4d] -> (u = SiLU(z_u) [T, d], hstu_attention(SiLU(z_q), SiLU(z_k), SiLU(z_v)) [T, H, d / H]).
// SiLU(q, k, v) is never written out: the attention applies it while packing its tiles.
std::tuple<at::Tensor, at::Tensor> hstu_uvqk_attention_fwd(
    const at::Tensor& z_in, const at::Tensor& offsets, int64_t max_len, double alpha, int64_t n_heads,
    const std::optional<at::Tensor>& pos_bias, const std::optional<at::Tensor>& time_bias,
    const std::optional<at::Tensor>& timestamps) {
  const char* op = "hstu_uvqk_attention";
  const at::Tensor z = check_uvqk(op, z_in, n_heads);
  Args a = check_args(op, block(z, 2, n_heads), block(z, 3, n_heads), block(z, 1, n_heads), offsets, max_len, pos_bias,
                      time_bias, timestamps);
  a.act = true;
  const int64_t rows = z.size(0), d = z.size(1) / 4, rz = z.stride(0);
  at::Tensor u = at::empty({rows, d}, z.options()), out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, z.scalar_type(), "hstu_uvqk_attention", [&] {
    using C = at::opmath_type<scalar_t>;
    const scalar_t* zp = z.data_ptr<scalar_t>();
    scalar_t* up = u.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t e = 0; e < d; ++e) up[r * d + e] = static_cast<scalar_t>(silu(static_cast<C>(zp[r * rz + e])));
    });
    out = forward_impl<scalar_t>(a, alpha);
  });
  return {u, out};
}

// -> (dz [T, 4d], dpos_bias, dtime_bias): dz_u = grad_u * SiLU'(z_u); dz_v, dz_q, dz_k are the
// attention's gradients times SiLU', written straight into their column blocks (no concatenation).
std::tuple<at::Tensor, at::Tensor, at::Tensor> hstu_uvqk_attention_bwd(
    const at::Tensor& grad_u, const at::Tensor& grad_attn, const at::Tensor& z_in, const at::Tensor& offsets,
    int64_t max_len, double alpha, int64_t n_heads, const std::optional<at::Tensor>& pos_bias,
    const std::optional<at::Tensor>& time_bias, const std::optional<at::Tensor>& timestamps, int64_t mode) {
  const char* op = "hstu_uvqk_attention_backward";
  const at::Tensor z = check_uvqk(op, z_in, n_heads);
  Args a = check_args(op, block(z, 2, n_heads), block(z, 3, n_heads), block(z, 1, n_heads), offsets, max_len, pos_bias,
                      time_bias, timestamps);
  a.act = true;
  const int64_t rows = z.size(0), d = z.size(1) / 4, rz = z.stride(0);
  TORCH_CHECK(grad_u.device().is_cpu() && grad_u.dim() == 2 && grad_u.size(0) == rows && grad_u.size(1) == d &&
                  grad_u.scalar_type() == z.scalar_type(),
              op, ": grad_u must be a ", z.scalar_type(), " CPU tensor [T=", rows, ", d=", d, "], got ", grad_u.sizes(),
              " ", grad_u.scalar_type());
  TORCH_CHECK(grad_attn.device().is_cpu() && grad_attn.dim() == 3 && grad_attn.size(0) == rows &&
                  grad_attn.size(1) == a.H && grad_attn.size(2) == a.Dv && grad_attn.scalar_type() == z.scalar_type(),
              op, ": grad_attn must be a ", z.scalar_type(), " CPU tensor [T=", rows, ", H=", a.H, ", D=", a.Dv,
              "], got ", grad_attn.sizes(), " ", grad_attn.scalar_type());
  const at::Tensor gu = grad_u.contiguous(), grad = dense_rows(grad_attn);
  at::Tensor dz = at::empty({rows, 4 * d}, z.options());
  at::Tensor dq = block(dz, 2, n_heads), dk = block(dz, 3, n_heads), dv = block(dz, 1, n_heads);
  auto dpos = a.has_pos ? at::empty_like(a.pos) : at::empty({0}, z.options());
  auto dtime = a.has_time ? at::empty_like(a.time) : at::empty({0}, z.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, z.scalar_type(), "hstu_uvqk_attention_backward", [&] {
    using C = at::opmath_type<scalar_t>;
    const scalar_t *zp = z.data_ptr<scalar_t>(), *gp = gu.data_ptr<scalar_t>();
    scalar_t* dp = dz.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) write_grad(dp + r * 4 * d, gp + r * d, d, C(1), zp + r * rz);
    });
    run_backward<scalar_t>(op, mode, a, alpha, grad, dq, dk, dv, dpos, dtime);
  });
  return {dz, dpos, dtime};
}

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // Jagged causal HSTU attention (contract: grlib/ops/attention.py). The bias tables are optional;
  // time_bias needs timestamps [T] int64.
  m.def("hstu_attention(Tensor q, Tensor k, Tensor v, Tensor offsets, int max_len, float alpha, "
        "Tensor? pos_bias, Tensor? time_bias, Tensor? timestamps) -> Tensor");
  m.def("hstu_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor offsets, int max_len, "
        "float alpha, Tensor? pos_bias, Tensor? time_bias, Tensor? timestamps, int mode=0) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // HSTU's SiLU + split + attention in one: z [T, 4d] (columns u | v | q | k) -> (SiLU(z_u) [T, d],
  // attention of SiLU(z_q), SiLU(z_k), SiLU(z_v) [T, n_heads, d / n_heads]).
  m.def("hstu_uvqk_attention(Tensor z, Tensor offsets, int max_len, float alpha, int n_heads, Tensor? pos_bias, "
        "Tensor? time_bias, Tensor? timestamps) -> (Tensor, Tensor)");
  m.def("hstu_uvqk_attention_backward(Tensor grad_u, Tensor grad_attn, Tensor z, Tensor offsets, int max_len, "
        "float alpha, int n_heads, Tensor? pos_bias, Tensor? time_bias, Tensor? timestamps, int mode=0) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("hstu_attention", &hstu_attention_fwd);
  m.impl("hstu_attention_backward", &hstu_attention_bwd);
  m.impl("hstu_uvqk_attention", &hstu_uvqk_attention_fwd);
  m.impl("hstu_uvqk_attention_backward", &hstu_uvqk_attention_bwd);
}
