// Forward pass of the jagged HSTU attention (design: hstu_attention.h): one task per (sequence,
// head, tile of 64 queries), walking the key tiles at or before it.
#include "hstu_attention.h"

namespace hstu {
namespace {

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

}  // namespace

at::Tensor forward(const Args& a, double alpha) {
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

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("hstu_attention", &hstu::hstu_attention_fwd); }
