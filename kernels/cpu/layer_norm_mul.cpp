// Fused LayerNorm(x) * u on CPU, forward and backward: the HSTU step after attention,
// Y = W2 . Dropout(LayerNorm(A V) * U), without the [N, d] LayerNorm output in between.
//
//   y = ((x - mean) * rstd * weight + bias) * u        x, u [N, d]; weight, bias [d]
//   layer_norm_mul_dropout: y * (words >= threshold) * scale as well, in the same pass (words [N, d]
//   int16, grlib/ops/dropout.py), and the backward applies the mask to the incoming gradient as
//   it reads it: LayerNorm, multiply and dropout are one pass over the rows forward and one back
//
// Rows are independent (OpenMP over row chunks through at::parallel_for). Row statistics are
// accumulated in double, the rest in float (double for float64 inputs); forward returns mean and
// rstd [N] in float (double) for the backward pass, which recomputes the normalised row instead of
// storing it (from a double mean split into two floats, see backward_row). The weight/bias
// gradients are summed per chunk of 64 rows in float (double for float64) into a buffer of the
// chunk's own, and the chunks' sums are reduced afterwards in double (race-free).
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include "isa.h"
#include "lane_sum.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "layer_norm_mul.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // y = LayerNorm(x; weight, bias, eps) * u over the last dim of x, u [N, d]
  m.def("layer_norm_mul(Tensor x, Tensor u, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_mul_backward(Tensor grad, Tensor x, Tensor u, Tensor weight, Tensor bias, Tensor mean, "
        "Tensor rstd) -> (Tensor, Tensor, Tensor, Tensor)");
  // the same, then * (words >= threshold) * scale: words [N, d] int16 (dropout_words, grlib/ops/dropout.py)
  m.def("layer_norm_mul_dropout(Tensor x, Tensor u, Tensor weight, Tensor bias, float eps, Tensor words, "
        "int threshold, float scale) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_mul_dropout_backward(Tensor grad, Tensor x, Tensor u, Tensor weight, Tensor bias, Tensor mean, "
        "Tensor rstd, Tensor words, int threshold, float scale) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("layer_norm_mul", GRLIB_DISPATCH(layer_norm_mul_fwd));
  m.impl("layer_norm_mul_backward", GRLIB_DISPATCH(layer_norm_mul_bwd));
  m.impl("layer_norm_mul_dropout", GRLIB_DISPATCH(layer_norm_mul_dropout_fwd));
  m.impl("layer_norm_mul_dropout_backward", GRLIB_DISPATCH(layer_norm_mul_dropout_bwd));
}

#else
namespace GRLIB_ISA_NS {

namespace {

void check(const at::Tensor& x, const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias,
           const char* op) {
  TORCH_CHECK(x.device().is_cpu() && u.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu(),
              op, ": every input must be a CPU tensor");
  TORCH_CHECK(x.dim() == 2 && u.sizes() == x.sizes(), op, ": x and u must both be [N, d], got ", x.sizes(),
              " and ", u.sizes());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()) && u.scalar_type() == x.scalar_type(), op,
              ": x and u must share one floating dtype, got ", x.scalar_type(), " and ", u.scalar_type());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(), op,
              ": weight and bias must be [d=", x.size(1), "], got ", weight.sizes(), " and ", bias.sizes());
  TORCH_CHECK(at::isFloatingType(weight.scalar_type()) && at::isFloatingType(bias.scalar_type()), op,
              ": weight and bias must be floating point");
}

constexpr int64_t GRAIN = 64;  // rows per chunk

}  // namespace

namespace {

// The dropout of layer_norm_mul_dropout: words [N, d] int16 (nullptr: none), kept where >= thr, times scale.
struct Drop {
  const int16_t* words = nullptr;
  int32_t thr = 0;
  double scale = 1.0;
};

Drop check_drop(const at::Tensor& words, const at::Tensor& x, int64_t threshold, double scale, const char* op) {
  TORCH_CHECK(words.device().is_cpu() && words.scalar_type() == at::kShort && words.sizes() == x.sizes(), op,
              ": words must be int16 of x's shape ", x.sizes(), ", got ", words.scalar_type(), " ", words.sizes());
  TORCH_CHECK(threshold >= -32768 && threshold <= 32768, op, ": threshold must be in [-32768, 32768], got ",
              threshold);
  TORCH_CHECK(words.is_contiguous(), op, ": words must be contiguous");
  return {words.data_ptr<int16_t>(), static_cast<int32_t>(threshold), scale};
}

}  // namespace

// -> (y [N, d], mean [N], rstd [N]); mean/rstd in float (double for float64 x)
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_impl(const at::Tensor& x_in, const at::Tensor& u_in,
                                                                   const at::Tensor& weight, const at::Tensor& bias,
                                                                   double eps, const Drop& drop, const char* op) {
  check(x_in, u_in, weight, bias, op);
  TORCH_CHECK(eps > 0, op, ": eps must be > 0, got ", eps);
  auto x = x_in.contiguous(), u = u_in.contiguous();
  const int64_t N = x.size(0), d = x.size(1);
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto y = at::empty_like(x);
  auto mean = at::empty({N}, x.options().dtype(acc_type)), rstd = at::empty({N}, x.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm_mul", [&] {
    using T = at::opmath_type<scalar_t>;
    const auto w = weight.to(acc_type).contiguous(), b = bias.to(acc_type).contiguous();
    const T *pw = w.data_ptr<T>(), *pb = b.data_ptr<T>();
    const scalar_t *px = x.data_ptr<scalar_t>(), *pu = u.data_ptr<scalar_t>();
    scalar_t* py = y.data_ptr<scalar_t>();
    T *pm = mean.data_ptr<T>(), *pr = rstd.data_ptr<T>();
    at::parallel_for(0, N, GRAIN, [&](int64_t r0, int64_t r1) {
      std::vector<T> widened(d);  // the row in T: the sums below vectorise over it (over bf16 they ran scalar)
      T* __restrict xw = widened.data();
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* xr = px + r * d;
        const scalar_t* ur = pu + r * d;
        for (int64_t e = 0; e < d; ++e) xw[e] = static_cast<T>(xr[e]);
        // row statistics in double: rows far from zero mean keep their digits
        const double md = d ? lane_sum<double>(d, [&](int64_t e) { return static_cast<double>(xw[e]); }) / d : 0.0;
        const double var = lane_sum<double>(d, [&](int64_t e) {
          const double c = static_cast<double>(xw[e]) - md;
          return c * c;
        });
        pm[r] = static_cast<T>(md);
        pr[r] = static_cast<T>(1.0 / std::sqrt((d ? var / d : 0.0) + eps));
        const T m = pm[r], rs = pr[r];
        if (drop.words) {  // as dropout_words: (y * keep) rounded to scalar_t, then * scale
          const int16_t* wr = drop.words + r * d;
          const T sc = static_cast<T>(drop.scale);
          for (int64_t e = 0; e < d; ++e) {
            const scalar_t v = static_cast<scalar_t>(((xw[e] - m) * rs * pw[e] + pb[e]) * static_cast<T>(ur[e]));
            const T keep = static_cast<int32_t>(wr[e]) >= drop.thr ? T(1) : T(0);
            py[r * d + e] = static_cast<scalar_t>(static_cast<T>(static_cast<scalar_t>(static_cast<T>(v) * keep)) * sc);
          }
        } else {
          for (int64_t e = 0; e < d; ++e)
            py[r * d + e] = static_cast<scalar_t>(((xw[e] - m) * rs * pw[e] + pb[e]) * static_cast<T>(ur[e]));
        }
      }
    });
  });
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_fwd(const at::Tensor& x, const at::Tensor& u,
                                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                                  double eps) {
  return layer_norm_mul_impl(x, u, weight, bias, eps, Drop{}, "layer_norm_mul");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_dropout_fwd(
    const at::Tensor& x, const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias, double eps,
    const at::Tensor& words, int64_t threshold, double scale) {
  const char* op = "layer_norm_mul_dropout";
  return layer_norm_mul_impl(x, u, weight, bias, eps, check_drop(words, x, threshold, scale, op), op);
}

// Not inlined: inside the caller GCC loses the restrict qualifiers and its runtime alias check sent
// every row down the scalar loop (3x slower). One row of the backward: dx, du [d] written, dweight
// and dbias [d] accumulated into the chunk's sums dw, db (in T; the caller adds each chunk's into
// double). The loops are split so that each one vectorises (restrict pointers, no branch inside):
// the dropout's backward first (grad * keep * scale, rounded as dropout_words rounds it), then x-hat
// and the products, the two row sums, dx.
// x-hat = (x - mean) * rstd with the mean taken in double and split into two floats (hi + lo): x - hi
// is exact near the mean, so rows far from zero mean keep their digits (a float mean alone lost them,
// and dweight summed those errors over every row) while the per-element work stays in float.
template <typename scalar_t, typename T>
__attribute__((noinline)) void backward_row(const scalar_t* __restrict xr, const scalar_t* __restrict ur,
                                            const scalar_t* __restrict gr, const int16_t* __restrict wr, int32_t thr,
                                            T sc, const T* __restrict pw, const T* __restrict pb, T rs, int64_t d,
                                            T* __restrict buf, scalar_t* __restrict dxr, scalar_t* __restrict dur,
                                            T* __restrict dw, T* __restrict db) {
  T* __restrict gv = buf;
  T* __restrict xhat = buf + d;
  T* __restrict dxhat = buf + 2 * d;
  T* __restrict xw = buf + 3 * d;  // the row in T: the mean's sum vectorises over it (over bf16 it ran scalar)
  for (int64_t e = 0; e < d; ++e) xw[e] = static_cast<T>(xr[e]);
  if (wr) {
    for (int64_t e = 0; e < d; ++e) {
      const T keep = static_cast<int32_t>(wr[e]) >= thr ? T(1) : T(0);
      const scalar_t kept = static_cast<scalar_t>(static_cast<T>(gr[e]) * keep);
      gv[e] = static_cast<T>(static_cast<scalar_t>(static_cast<T>(kept) * sc));
    }
  } else {
    for (int64_t e = 0; e < d; ++e) gv[e] = static_cast<T>(gr[e]);
  }
  const double md = lane_sum<double>(d, [&](int64_t e) { return static_cast<double>(xw[e]); }) / d;
  const T hi = static_cast<T>(md), lo = static_cast<T>(md - static_cast<double>(hi));
  for (int64_t e = 0; e < d; ++e) {
    const T xh = ((xw[e] - hi) - lo) * rs;
    const T gl = gv[e] * static_cast<T>(ur[e]);  // dL/d LayerNorm(x)
    dur[e] = static_cast<scalar_t>(gv[e] * (xh * pw[e] + pb[e]));
    dw[e] += gl * xh;
    db[e] += gl;
    xhat[e] = xh;
    dxhat[e] = gl * pw[e];
  }
  const T a1 = lane_sum<T, 16>(d, [&](int64_t e) { return dxhat[e]; }) / static_cast<T>(d);
  const T a2 = lane_sum<T, 16>(d, [&](int64_t e) { return dxhat[e] * xhat[e]; }) / static_cast<T>(d);
  for (int64_t e = 0; e < d; ++e) dxr[e] = static_cast<scalar_t>(rs * (dxhat[e] - a1 - xhat[e] * a2));
}

// -> (dx, du, dweight, dbias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_bwd_impl(
    const at::Tensor& grad_in, const at::Tensor& x_in, const at::Tensor& u_in, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& mean_in, const at::Tensor& rstd_in, const Drop& drop, const char* op) {
  check(x_in, u_in, weight, bias, op);
  TORCH_CHECK(grad_in.sizes() == x_in.sizes() && grad_in.scalar_type() == x_in.scalar_type(),
              op, ": grad must match x ", x_in.sizes(), " ", x_in.scalar_type(), ", got ",
              grad_in.sizes(), " ", grad_in.scalar_type());
  auto x = x_in.contiguous(), u = u_in.contiguous(), g = grad_in.contiguous();
  const int64_t N = x.size(0), d = x.size(1);
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(mean_in.numel() == N && rstd_in.numel() == N && mean_in.scalar_type() == acc_type &&
                  rstd_in.scalar_type() == acc_type,
              op, ": mean and rstd must be [N=", N, "] ", acc_type);
  auto mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  auto dx = at::empty_like(x), du = at::empty_like(u);
  const int64_t chunks = std::max<int64_t>(1, (N + GRAIN - 1) / GRAIN);
  // per chunk: its dweight, dbias sums, widened to double (the sum over chunks is taken in double)
  auto partial = at::empty({chunks, 2, d}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm_mul_backward", [&] {
    using T = at::opmath_type<scalar_t>;
    const auto w = weight.to(acc_type).contiguous(), b = bias.to(acc_type).contiguous();
    const T *pw = w.data_ptr<T>(), *pb = b.data_ptr<T>(), *pr = rstd.data_ptr<T>();
    const scalar_t *px = x.data_ptr<scalar_t>(), *pu = u.data_ptr<scalar_t>(), *pg = g.data_ptr<scalar_t>();
    scalar_t *pdx = dx.data_ptr<scalar_t>(), *pdu = du.data_ptr<scalar_t>();
    double* pp = partial.data_ptr<double>();
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      std::vector<T> buf(4 * d);  // per row: the gradient after dropout, x-hat, dL/dx-hat, x in T
      std::vector<T> sums(2 * d);  // the chunk's dweight, dbias
      for (int64_t c = c0; c < c1; ++c) {
        T *dw = sums.data(), *db = dw + d;  // this chunk's (at most GRAIN rows), in T
        std::fill(sums.begin(), sums.end(), T(0));
        for (int64_t r = c * GRAIN; r < std::min(N, (c + 1) * GRAIN); ++r)
          backward_row<scalar_t, T>(px + r * d, pu + r * d, pg + r * d, drop.words ? drop.words + r * d : nullptr,
                                    drop.thr, static_cast<T>(drop.scale), pw, pb, pr[r], d, buf.data(), pdx + r * d,
                                    pdu + r * d, dw, db);
        double* part = pp + c * 2 * d;  // [dweight | dbias] of the chunk, in double
        for (int64_t e = 0; e < 2 * d; ++e) part[e] = static_cast<double>(sums[e]);
      }
    });
  });
  auto sums = partial.sum(0);  // [2, d]
  return {dx, du, sums[0].to(weight.scalar_type()), sums[1].to(bias.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_bwd(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& mean, const at::Tensor& rstd) {
  return layer_norm_mul_bwd_impl(grad, x, u, weight, bias, mean, rstd, Drop{}, "layer_norm_mul_backward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_dropout_bwd(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& u, const at::Tensor& weight, const at::Tensor& bias,
    const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& words, int64_t threshold, double scale) {
  const char* op = "layer_norm_mul_dropout_backward";
  return layer_norm_mul_bwd_impl(grad, x, u, weight, bias, mean, rstd, check_drop(words, x, threshold, scale, op),
                                 op);
}

}  // namespace GRLIB_ISA_NS
#endif
