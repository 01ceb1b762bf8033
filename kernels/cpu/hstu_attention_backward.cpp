// Backward pass of the jagged HSTU attention (design: hstu_attention.h): dq, dk, dv and the
// bias-table gradients, the scores recomputed tile by tile. Two forms: two passes (dq and the bias
// gradients by query tile, then dk and dv by key tile) or one pass per (sequence, head); run_backward
// picks one.
#include "hstu_attention.h"
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "hstu_attention_backward.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("hstu_attention_backward", GRLIB_DISPATCH(hstu::hstu_attention_bwd)); }

#else
namespace GRLIB_ISA_NS {

namespace hstu {
namespace {

// Adds a task's bias-gradient columns to its partial tables: row b < Bt to time bucket b, row Bt to
// the last position bucket (the rows a table does not have stay zero and are skipped).
template <typename T>
void flush_bias_columns(const BucketColumns<T>& cols, const Args& a, T* gpos, T* gtime) {
  if (a.has_pos) gpos[a.P - 1] += cols.sum(a.Bt);
  if (a.has_time)
    for (int64_t b = 0; b < a.Bt; ++b) gtime[b] += cols.sum(b);
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
  // dQ [BLK, Dp]; the bias-gradient columns [Bt + 1, BLK] (BucketColumns: time buckets, then the last
  // position bucket)
  const int64_t tile = BLK * (3 * Dp + 2 * Dvp + 2 * BLK + Bt + 1);
  auto bufs = scratch<T>(workers, tile);
  BiasGrads<T> bias_grads(tasks.size(), P, Bt);
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *QT = bufs[w].data(), *dOT = QT + Dp * BLK, *Ks = dOT + Dvp * BLK, *Vs = Ks + BLK * Dp, *ST = Vs + BLK * Dvp;
    T *dWT = ST + BLK * BLK, *dQ = dWT + BLK * BLK;
    BucketColumns<T> cols{dQ + BLK * Dp, Bt + 1};
    cols.clear();
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
      const int tri = j0 == i0 ? UPPER : 0;  // a diagonal tile: query >= key
      pack_rows(k + (base + j0) * a.rk + t.h * D, a.rk, nk, D, Dp, T(1), Ks, a.act);
      pack_rows(v + (base + j0) * a.rv + t.h * Dv, a.rv, nk, Dv, Dvp, T(1), Vs, a.act);
      tile_nt(Ks, QT, Dp, ST, nk, nq, tri);    // scores^T [key, query]
      tile_nt(Vs, dOT, Dvp, dWT, nk, nq, tri);  // (dO V^T)^T = dL/dweights^T
      for (int64_t c = 0; c < nk; ++c) {  // dWT <- dL/dscores^T; bias gradients
        const int64_t j = j0 + c, first = std::min(std::max<int64_t>(0, j - i0), nq);
        const int64_t tsj = bias.ts ? bias.ts[j] : 0;
        T *s = ST + c * BLK, *ds = dWT + c * BLK;
        TimeRuns runs;
        add_bias<1>(s, first, nq, i0 - j, bias, tsq, tsj, &runs);
        silu_backward<T>(s, ds, first, nq, p.inv_n);
        std::fill(ds, ds + first, T(0));
        if (a.has_pos) {  // i - j = i0 - j + r: one bucket each below P - 1, the rest share the last
          const int64_t clamp = std::min(std::max(first, P - 1 - (i0 - j)), nq);
          T* __restrict gp = gpos;
          for (int64_t r = first; r < clamp; ++r) gp[i0 - j + r] += ds[r];
          cols.add(Bt, ds, clamp, nq);
        }
        if (tsq) add_time_grads(ds, tsq, tsj, first, nq, Bt, gtime, runs, cols);
      }
      tile_tn_acc(dWT, Ks, Dp, dQ, nq, nk, tri ? LOWER : 0);  // dQ += dS K
    }
    for (int64_t r = 0; r < nq; ++r)
      write_grad(gq + (base + i0 + r) * oq + t.h * D, dQ + r * Dp, D, p.alpha,
                 a.act ? q + (base + i0 + r) * a.rq + t.h * D : nullptr);
    flush_bias_columns(cols, a, gpos, gtime);
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
      const int tri = i0 == j0 ? LOWER : 0;  // a diagonal tile: key <= query
      pack_rows(q + (base + i0) * a.rq + t.h * D, a.rq, nq, D, Dp, T(1), Qs, a.act);
      pack_rows(g + (base + i0) * rg + t.h * Dv, rg, nq, Dv, Dvp, T(1), dOs);
      tile_nt(Qs, KT, Dp, S, nq, nk, tri);    // scores [query, key]
      tile_nt(dOs, VT, Dvp, dW, nq, nk, tri);  // dO V^T
      for (int64_t r = 0; r < nq; ++r) {  // S <- weights, dW <- dL/dscores; zero where j > i
        const int64_t i = i0 + r, valid = std::min(nk, i - j0 + 1);
        T *s = S + r * BLK, *ds = dW + r * BLK;
        add_bias<-1>(s, 0, valid, i - j0, bias, tsk, bias.ts ? bias.ts[i] : 0);
        silu_both<T>(s, ds, 0, valid, p.inv_n);
        std::fill(s + valid, s + nk, T(0));
        std::fill(ds + valid, ds + nk, T(0));
      }
      tile_tn_acc(S, dOs, Dvp, dV, nk, nq, tri ? UPPER : 0);  // dV += W^T dO
      tile_tn_acc(dW, Qs, Dp, dK, nk, nq, tri ? UPPER : 0);   // dK += dS^T Q
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
  const int64_t workers = p.workers(tasks.size()), Lp = round_up(longest_sequence(p.o, a.B), BLK);
  // per worker: Q [Lp, Dp], dO [Lp, Dvp], dQ [Lp, Dp] (the whole sequence); KT [Dp, BLK], K [BLK, Dp],
  // VT [Dvp, BLK], dK [BLK, Dp], dV [BLK, Dvp]; S, dW [BLK, BLK]
  // gposr [P]: the task's position-bias gradient, reversed (contiguous along a score row); the
  // bias-gradient columns [Bt + 1, BLK]
  const int64_t seq = Lp * (2 * Dp + Dvp), tile = seq + BLK * (3 * Dp + 2 * Dvp + 2 * BLK + Bt + 1) + P;
  auto bufs = scratch<T>(workers, tile);
  BiasGrads<T> bias_grads(tasks.size(), P, Bt);
  run_tasks(tasks, workers, [&](int64_t w, const Task& t) {
    T *Qs = bufs[w].data(), *dOs = Qs + Lp * Dp, *dQ = dOs + Lp * Dvp, *KT = dQ + Lp * Dp, *Ks = KT + Dp * BLK;
    T *VT = Ks + BLK * Dp, *dK = VT + Dvp * BLK, *dV = dK + BLK * Dp, *S = dV + BLK * Dvp, *dW = S + BLK * BLK;
    BucketColumns<T> cols{dW + BLK * BLK, Bt + 1};
    cols.clear();
    T* gposr = cols.acc + (Bt + 1) * BLK;  // gposr[P - 1 - d]: the gradient of bucket d < P - 1
    std::fill(gposr, gposr + P, T(0));
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
        const int tri = i0 == j0 ? LOWER : 0;  // a diagonal tile: key <= query
        tile_nt(Qi, KT, Dp, S, nq, nk, tri);    // scores [query, key] = alpha q_i . k_j
        tile_nt(dOi, VT, Dvp, dW, nq, nk, tri);  // dL/dweights = dO V^T
        for (int64_t r = 0; r < nq; ++r) {  // S <- weights, dW <- dL/dscores; zero where j > i
          const int64_t i = i0 + r, valid = std::min(nk, i - j0 + 1), tsi = bias.ts ? bias.ts[i] : 0;
          T *s = S + r * BLK, *ds = dW + r * BLK;
          TimeRuns runs;
          add_bias<-1>(s, 0, valid, i - j0, bias, tsk, tsi, &runs);
          silu_both<T>(s, ds, 0, valid, p.inv_n);
          std::fill(s + valid, s + nk, T(0));
          std::fill(ds + valid, ds + nk, T(0));
          if (a.has_pos) {  // i - j = (i - j0) - c: the first keys may share the last bucket
            const int64_t tail = std::min(valid, std::max<int64_t>(0, i - j0 - (P - 1) + 1));
            cols.add(Bt, ds, 0, tail);
            T* __restrict gr = gposr;  // bucket d = i - j0 - c at gposr[P - 1 - d]
            for (int64_t c = tail; c < valid; ++c) gr[P - 1 - (i - j0) + c] += ds[c];
          }
          if (tsk) add_time_grads(ds, tsk, tsi, 0, valid, Bt, gtime, runs, cols);
        }
        tile_tn_acc(S, dOi, Dvp, dV, nk, nq, tri ? UPPER : 0);  // dV_j += W^T dO_i
        tile_tn_acc(dW, Qi, Dp, dK, nk, nq, tri ? UPPER : 0);   // dK_j += dS^T (alpha Q_i)
        tile_nn_acc(dW, Ks, Dp, dQ + i0 * Dp, nq, nk, tri);     // dQ_i += dS K_j
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
    if (a.has_pos)
      for (int64_t d = 0; d < P - 1; ++d) gpos[d] += gposr[P - 1 - d];
    flush_bias_columns(cols, a, gpos, gtime);
  });
  bias_grads.reduce(tasks, a, dpos, dtime);
}

// Auto mode: one pass when its (sequence, head) tasks can keep every worker busy
// (sequence_tasks_balance), else the two passes, whose tasks are single tiles.
// mode: 0 auto, 1 one pass (backward_single), 2 two passes (backward_dq + backward_dkv).
template <typename scalar_t>
void run_backward(const char* op, int64_t mode, const Args& a, double alpha, const at::Tensor& grad, at::Tensor& dq,
                  at::Tensor& dk, at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime) {
  TORCH_CHECK(mode >= 0 && mode <= 2, op, ": mode must be 0 (auto), 1 (one pass) or 2 (two passes), got ", mode);
  const bool single = mode == 1 || (mode == 0 && sequence_tasks_balance(sequence_tasks(
                                                     a.offsets.data_ptr<int64_t>(), a.B, a.H)));
  if (single) {
    backward_single<scalar_t>(a, alpha, grad, dq, dk, dv, dpos, dtime);
  } else {
    backward_dq<scalar_t>(a, alpha, grad, dq, dpos, dtime);
    backward_dkv<scalar_t>(a, alpha, grad, dk, dv);
  }
}

}  // namespace

void backward(const char* op, int64_t mode, const Args& a, double alpha, const at::Tensor& grad, at::Tensor& dq,
              at::Tensor& dk, at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime) {
#if GRLIB_VBYTES == 64
  if (on_bf16_units(a)) return backward_bf16(op, mode, a, alpha, grad, dq, dk, dv, dpos, dtime);
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.q.scalar_type(), "hstu_attention_backward", [&] {
    run_backward<scalar_t>(op, mode, a, alpha, grad, dq, dk, dv, dpos, dtime);
  });
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
  backward("hstu_attention_backward", mode, a, alpha, grad, dq, dk, dv, dpos, dtime);
  return {dq, dk, dv, dpos, dtime};
}

}  // namespace hstu

}  // namespace GRLIB_ISA_NS
#endif
