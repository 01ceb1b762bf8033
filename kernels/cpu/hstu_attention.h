// Fused jagged HSTU attention on CPU: forward and backward, no padding, no T x max_len matrix.
//
// For each sequence b (tokens offsets[b] .. offsets[b+1]), head h, query i and key j <= i:
//
//   s_ij = alpha * q_i . k_j + pos_bias[h, min(i - j, P - 1)] + time_bias[h, bucket(t_i - t_j)]
//   out_i = sum_{j <= i} SiLU(s_ij) * v_j / max_len,   bucket(dt) = min(floor(log2(1 + |dt|)), Bt - 1)
//
// The contract and the padded reference (the ground truth) are in grlib/ops/attention.py.
//
// Work is split into tasks: a (sequence, head) where those tasks balance over the workers, else a
// (sequence, head, tile of 64 queries) in the forward pass and the dq pass and a (sequence, head,
// tile of 64 keys) in the dk/dv pass. Tasks are sorted by cost (longest first) and handed out
// dynamically to the OpenMP workers of at::parallel_for. The forward task packs the keys and values
// it attends to once into per-worker scratch (rows of Dp values, float32 for float/bf16/half
// inputs, float64 for float64), and each query tile transposed ([D, 64]); a backward task packs its
// own tiles and copies the tiles it walks (flash-attention style). The 64 x 64 score tile comes
// from a register-blocked micro-kernel (only the vectors the causal mask leaves on a diagonal
// tile), bias + SiLU (+ the mask on the diagonal tile) are applied in place by vectorisable loops,
// and the tile is multiplied into the task's accumulator. Where a sequence's timestamps are sorted
// (checked per call), a tile row's time buckets form a few constant runs (time_runs), and
// the time bias and its gradient go run by run as masked vector ops; else bucket by bucket. Nothing larger than a tile (a sequence's
// keys and values in the forward) is materialised; backward recomputes the scores.
//
// Bias-table gradients are summed into one partial table per task (through per-column sums of
// the task's score rows where a bucket covers a run of columns: BucketColumns) and reduced in task
// order at the end (BiasGrads), so no two threads ever write the same memory and every run gives
// bitwise the same gradients, whatever the scheduling.
//
// The sources: this header (the inputs of a call, the state of a pass, packing rows into tiles,
// the bias-gradient partials), hstu_tiles.h (vectors and micro-kernels), hstu_silu_bias.h (SiLU,
// bias terms and their gradients), hstu_tasks.h (tasks and their scheduling); the translation
// units hstu_attention.cpp (schemas and input checks), hstu_attention_forward.cpp,
// hstu_attention_backward.cpp and hstu_uvqk_attention.cpp (HSTU's SiLU + split + attention fused).
#include "isa.h"

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "hstu_silu_bias.h"
#include "hstu_tasks.h"
#include "hstu_tiles.h"

// once per path (isa.h): GRLIB_ISA_NS is the path's namespace
#if defined(GRLIB_ISA_NS) && !defined(GRLIB_HSTU_ATTENTION_H)
#define GRLIB_HSTU_ATTENTION_H
namespace GRLIB_ISA_NS::hstu {

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
at::Tensor dense_rows(const at::Tensor& t);

// Checks the inputs of `op` (errors name it) and makes them contiguous where they must be.
Args check_args(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& offsets, int64_t max_len, const std::optional<at::Tensor>& pos_bias,
                const std::optional<at::Tensor>& time_bias, const std::optional<at::Tensor>& timestamps);

// The attention of the checked inputs (hstu_attention_forward.cpp) -> out [T, H, Dv].
at::Tensor forward(const Args& a, double alpha);

// Its gradients (hstu_attention_backward.cpp) written into dq, dk [T, H, D], dv [T, H, Dv] (any row
// stride) and the bias-table gradients dpos [H, P], dtime [H, Bt] (each when its table exists).
// mode: 0 auto, 1 one pass, 2 two passes; errors name `op`.
void backward(const char* op, int64_t mode, const Args& a, double alpha, const at::Tensor& grad, at::Tensor& dq,
              at::Tensor& dk, at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime);

#if GRLIB_VBYTES == 64
// bf16 inputs on the CPU's bf16 units (isa.h's units: AMX or AVX512-BF16; hstu_attention_bf16.cpp):
// whether a call takes that path, and its forward and backward (the contracts of forward / backward).
bool on_bf16_units(const Args& a);
at::Tensor forward_bf16(const Args& a, double alpha);
void backward_bf16(const char* op, int64_t mode, const Args& a, double alpha, const at::Tensor& grad, at::Tensor& dq,
                   at::Tensor& dk, at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime);
#endif

// ---- packing -------------------------------------------------------------------------------------

// n rows of a [T, H, D] tensor (row stride `stride`) -> dst [n, Dp] (times `scale`; of SiLU(x)
// when `act`), zero padded: a contiguous copy per row, then SiLU and the scale in place (plain
// loops over contiguous floats, which the compiler vectorises).
// Rows PACK_AHEAD ahead are prefetched while a row is copied: the rows of a tile are strided
// (H * D apart, or 4d in the fused uvqk op), and without it the copy waited on each row's cache
// misses (a profile put 91% of pack_rows' samples on one store).
constexpr int64_t PACK_AHEAD = 4;

template <typename scalar_t, typename T>
void pack_rows(const scalar_t* src, int64_t stride, int64_t n, int64_t D, int64_t Dp, T scale, T* dst,
               bool act = false) {
  constexpr int64_t LINE = 64 / sizeof(scalar_t);  // elements per cache line
  for (int64_t r = 0; r < std::min(n, PACK_AHEAD); ++r)
    for (int64_t e = 0; e < D; e += LINE) __builtin_prefetch(src + r * stride + e, 0, 3);
  for (int64_t r = 0; r < n; ++r) {
    if (r + PACK_AHEAD < n)
      for (int64_t e = 0; e < D; e += LINE) __builtin_prefetch(src + (r + PACK_AHEAD) * stride + e, 0, 3);
    const scalar_t* s = src + r * stride;
    T* __restrict d = dst + r * Dp;
    for (int64_t e = 0; e < D; ++e) d[e] = static_cast<T>(s[e]);
    if (act)
      silu_row(d, d, D, scale);
    else if (scale != T(1))
      for (int64_t e = 0; e < D; ++e) d[e] *= scale;
    for (int64_t e = D; e < Dp; ++e) d[e] = T(0);
  }
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
template <typename scalar_t, typename Val, typename T>
inline void write_grad(scalar_t* __restrict dst, const Val* __restrict val, int64_t n, T scale,
                       const scalar_t* __restrict pre) {
  if constexpr (std::is_same_v<scalar_t, T> && std::is_same_v<Val, T>) {
    if (pre) {
      silu_grad_row(val, pre, dst, n, scale);
      return;
    }
  }
  if (pre)
    for (int64_t e = 0; e < n; ++e)
      dst[e] = static_cast<scalar_t>(scale * static_cast<T>(val[e]) * silu_grad(static_cast<T>(pre[e])));
  else
    for (int64_t e = 0; e < n; ++e) dst[e] = static_cast<scalar_t>(scale * static_cast<T>(val[e]));
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

// Everything a pass needs, in the compute type T.
template <typename scalar_t>
struct Pass {
  using T = at::opmath_type<scalar_t>;
  const Args& a;
  int64_t H, D, Dv, Dp, Dvp, hsv;
  const int64_t* o;
  const int64_t* ts;
  std::vector<T> pos, posr, time;  // posr: each head's pos table reversed (Bias::posr)
  std::vector<uint8_t> sorted;      // [B] sequence b's timestamps are non-decreasing (Bias::sorted)
  T alpha, inv_n;

  Pass(const Args& args, double alpha_in)
      : a(args), H(args.H), D(args.D), Dv(args.Dv), Dp(round_up(args.D, VEC)), Dvp(round_up(args.Dv, VEC)),
        hsv(args.H * args.Dv), o(args.offsets.data_ptr<int64_t>()),
        ts(args.has_time ? args.ts.data_ptr<int64_t>() : nullptr), pos(table<T>(args.pos, args.has_pos, H, args.P)),
        time(table<T>(args.time, args.has_time, H, args.Bt)), alpha(static_cast<T>(alpha_in)),
        inv_n(T(1) / static_cast<T>(args.max_len)) {
    posr.resize(pos.size());
    for (int64_t h = 0; h < H; ++h) std::reverse_copy(pos.begin() + h * a.P, pos.begin() + (h + 1) * a.P, posr.begin() + h * a.P);
    sorted.assign(a.B, 0);
    for (int64_t b = 0; ts && b < a.B; ++b)
      sorted[b] = std::is_sorted(ts + o[b], ts + o[b + 1]);
  }

  Bias<T> bias(int64_t b, int64_t h) const {
    return {pos.data() + h * a.P, posr.data() + h * a.P, time.data() + h * a.Bt, ts ? ts + o[b] : nullptr,
            a.P, a.Bt, a.has_pos, ts && sorted[b]};
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

}  // namespace GRLIB_ISA_NS::hstu
#endif
