// Forward pass of the jagged HSTU attention (design: hstu_attention.h): tasks of (sequence, head) or
// (sequence, head, tile of 64 queries), each walking the key tiles at or before its queries.
#include "hstu_attention.h"
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "hstu_attention_forward.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("hstu_attention", GRLIB_DISPATCH(hstu::hstu_attention_fwd)); }

#else
namespace GRLIB_ISA_NS {

namespace hstu {
namespace {

// One task per (sequence, head) when those tasks balance over the workers (sequence_tasks_balance),
// else one per (sequence, head, query tile). A task packs the
// keys and values it attends to once (SiLU applied when the inputs are pre-activations), then walks
// its query tiles: each packs its queries transposed and multiplies them with the packed key tiles
// in place (no copy per tile pair).
template <typename scalar_t>
at::Tensor forward_impl(const Args& a, double alpha_in) {
  using T = at::opmath_type<scalar_t>;
  const Pass<scalar_t> p(a, alpha_in);
  const int64_t Dp = p.Dp, Dvp = p.Dvp, D = p.D, Dv = p.Dv, hsv = p.hsv;
  auto out = at::empty({a.T, a.H, a.Dv}, a.q.options());
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
  scalar_t* y = out.data_ptr<scalar_t>();
  const ForwardTasks ft = forward_tasks(p.o, a.B, a.H);
  const std::vector<Task>& tasks = ft.tasks;
  const int64_t workers = p.workers(tasks.size()), Lp = round_up(longest_sequence(p.o, a.B), BLK);
  // per worker: K [Lp, Dp], V [Lp, Dvp] (the task's keys and values), QT [Dp, BLK], ST [BLK, BLK], O [BLK, Dvp]
  auto bufs = scratch<T>(workers, Lp * (Dp + Dvp) + BLK * (Dp + BLK + Dvp));
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *Kp = bufs[w].data(), *Vp = Kp + Lp * Dp, *QT = Vp + Lp * Dvp, *ST = QT + Dp * BLK, *O = ST + BLK * BLK;
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base;
    const int64_t tile0 = ft.tile0(t), tile1 = ft.tile1(t, L);
    const int64_t keys = std::min(L, tile1 * BLK);  // keys [0, keys) are attended to
    const Bias<T> bias = p.bias(t.b, t.h);
    pack_rows(k + base * a.rk + t.h * D, a.rk, keys, D, Dp, T(1), Kp, a.act);
    pack_rows(v + base * a.rv + t.h * Dv, a.rv, keys, Dv, Dvp, T(1), Vp, a.act);
    for (int64_t i0 = tile0 * BLK; i0 < tile1 * BLK; i0 += BLK) {
      const int64_t nq = std::min(BLK, L - i0);
      const int64_t* tsq = bias.ts ? bias.ts + i0 : nullptr;
      pack_cols(q + (base + i0) * a.rq + t.h * D, a.rq, nq, D, Dp, p.alpha, QT, a.act);
      std::fill(O, O + nq * Dvp, T(0));
      for (int64_t j0 = 0; j0 < i0 + nq; j0 += BLK) {
        const int64_t nk = std::min(BLK, i0 + nq - j0);
        const bool diag = j0 == i0;  // the causal mask cuts this tile
        tile_nt(Kp + j0 * Dp, QT, Dp, ST, nk, nq, diag ? UPPER : 0);  // ST [key c, query r] = alpha k_j . q_i
        for (int64_t c = 0; c < nk; ++c) {  // weights^T; zero where j > i (r < first)
          const int64_t j = j0 + c, first = std::min(std::max<int64_t>(0, j - i0), nq);
          T* s = ST + c * BLK;
          add_bias<1>(s, first, nq, i0 - j, bias, tsq, bias.ts ? bias.ts[j] : 0);
          silu_scale(s, first, nq, p.inv_n);
          std::fill(s, s + first, T(0));
        }
        tile_tn_acc(ST, Vp + j0 * Dvp, Dvp, O, nq, nk, diag ? LOWER : 0);  // O += W V
      }
      for (int64_t r = 0; r < nq; ++r)
        for (int64_t e = 0; e < Dv; ++e) y[(base + i0 + r) * hsv + t.h * Dv + e] = static_cast<scalar_t>(O[r * Dvp + e]);
    }
  });
  return out;
}

}  // namespace

at::Tensor forward(const Args& a, double alpha) {
#if GRLIB_VBYTES == 64
  if (on_bf16_units(a)) return forward_bf16(a, alpha);
#endif
  at::Tensor out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.q.scalar_type(), "hstu_attention", [&] {
    out = forward_impl<scalar_t>(a, alpha);
  });
  return out;
}

// q, k [T, H, Dqk], v [T, H, Dv], offsets [B+1] -> out [T, H, Dv]
at::Tensor hstu_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& offsets, int64_t max_len, double alpha,
                              const std::optional<at::Tensor>& pos_bias, const std::optional<at::Tensor>& time_bias,
                              const std::optional<at::Tensor>& timestamps) {
  const Args a = check_args("hstu_attention", q, k, v, offsets, max_len, pos_bias, time_bias, timestamps);
  return forward(a, alpha);
}

}  // namespace hstu

}  // namespace GRLIB_ISA_NS
#endif
