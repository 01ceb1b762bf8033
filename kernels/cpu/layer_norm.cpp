// LayerNorm over the last dim on CPU, forward and backward, with two things fused that a model
// otherwise runs as passes of their own over [N, d]:
//
//   y = LayerNorm(x; weight, bias, eps)                               x [N, d]; weight, bias [d]
//   l2:        y = z / max(||z||_2, l2_eps), z = LayerNorm(x)        (torch.nn.functional.normalize)
//   out dtype: y rounded once to bf16 from float32 x (the input of a bf16 projection)
//
// HSTU uses both: its final LayerNorm then L2 normalisation (F.normalize's div, norm, clamp and their
// backward were a dozen passes over [T, d]), and each layer's input LayerNorm, which feeds a bf16
// projection under model.precision bf16 (a LayerNorm, then a cast, and in backward a cast back).
//
// Rows are independent (at::parallel_for over chunks of 64 rows). As in layer_norm_mul.cpp: row
// statistics in double; rstd [N] returned in float (double for float64 x); x-hat from the double
// mean split into two floats (x - hi - lo), the same in forward and backward; the backward
// recomputes the mean, x-hat, z and ||z|| from x instead of storing them; weight/bias gradients summed per
// chunk of 64 rows in float (double for float64) into buffers of the chunk's own, then reduced across
// chunks in double (race-free).
// Backward of the L2 step: dz = (g - y (g . y)) / max(||z||, l2_eps) where ||z|| >= l2_eps, else
// g / l2_eps (the clamp passes no gradient to the norm, as torch's clamp_min).
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>
#include "isa.h"
#include "lane_sum.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "layer_norm.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // y [N, d] (in `dtype`: x's, or bfloat16 for float32 x), rstd [N]; l2_eps: None = no L2 step
  m.def("layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, float? l2_eps, ScalarType? dtype) "
        "-> (Tensor, Tensor)");
  // grad [N, d] in y's dtype -> (dx [N, d] in x's dtype, dweight, dbias)
  m.def("layer_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor bias, Tensor rstd, float? l2_eps) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("layer_norm", GRLIB_DISPATCH(layer_norm_fwd));
  m.impl("layer_norm_backward", GRLIB_DISPATCH(layer_norm_bwd));
}

#else
namespace GRLIB_ISA_NS {

namespace {

constexpr int64_t GRAIN = 64;  // rows per chunk

void check(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const char* op) {
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu() && bias.device().is_cpu(), op,
              ": every input must be a CPU tensor");
  TORCH_CHECK(x.dim() == 2 && at::isFloatingType(x.scalar_type()), op, ": x must be a floating [N, d], got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && bias.sizes() == weight.sizes(), op,
              ": weight and bias must be [d=", x.size(1), "], got ", weight.sizes(), " and ", bias.sizes());
  TORCH_CHECK(at::isFloatingType(weight.scalar_type()) && at::isFloatingType(bias.scalar_type()), op,
              ": weight and bias must be floating point");
}

double check_l2(std::optional<double> l2_eps, const char* op) {
  TORCH_CHECK(!l2_eps || *l2_eps > 0, op, ": l2_eps must be > 0 (or None: no L2 step), got ", l2_eps.value_or(0));
  return l2_eps.value_or(0.0);
}

// Calls f(scalar_t-typed zero, out_t-typed zero) for x's dtype and the output's: the same dtype, or
// float32 x with a bfloat16 output.
template <typename F>
void dispatch(at::ScalarType in, at::ScalarType out, const char* op, const F& f) {
  if (in == at::kFloat && out == at::kBFloat16) return f(float{}, at::BFloat16{});
  TORCH_CHECK(in == out, op, ": the output dtype must be x's or, for float32 x, bfloat16; got ", in, " -> ", out);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, in, "layer_norm", [&] { f(scalar_t{}, scalar_t{}); });
}

// One row's x-hat into xh [d] (T): ((x - hi) - lo) * rs, with the double mean md split into hi + lo.
template <typename scalar_t, typename T>
__attribute__((noinline)) void row_xhat(const scalar_t* __restrict xr, double md, T rs, int64_t d,
                                        T* __restrict xh) {
  const T hi = static_cast<T>(md), lo = static_cast<T>(md - static_cast<double>(hi));
  for (int64_t e = 0; e < d; ++e) xh[e] = ((static_cast<T>(xr[e]) - hi) - lo) * rs;
}

// z = xh * w + b into z [d]; returns 1 / max(||z||, l2_eps) (double) and sets clamped (||z|| < l2_eps).
template <typename T>
__attribute__((noinline)) double row_z(const T* __restrict xh, const T* __restrict pw, const T* __restrict pb,
                                       int64_t d, double l2_eps, T* __restrict z, bool& clamped) {
  for (int64_t e = 0; e < d; ++e) z[e] = xh[e] * pw[e] + pb[e];
  const double n = std::sqrt(lane_sum<double>(d, [&](int64_t e) { return static_cast<double>(z[e]) * z[e]; }));
  clamped = n < l2_eps;
  return 1.0 / std::max(n, l2_eps);
}

// One row of the backward: dx [d] written, dweight, dbias [d] accumulated into the chunk's sums, in
// double (each product exact): with float sums over a chunk of 64 rows, dbias was 2.75e-6 from the
// float64 answer at d = 1 and 200 rows (9e-9 with double sums); in tests/test_layer_norm.py's first
// failing case torch's own float32 backward was within 2.4e-7.
template <typename scalar_t, typename out_t, typename T>
__attribute__((noinline)) void backward_row(const scalar_t* __restrict xr, const out_t* __restrict gr,
                                            const T* __restrict pw, const T* __restrict pb, double md, T rs,
                                            double l2_eps, int64_t d, T* __restrict buf, scalar_t* __restrict dxr,
                                            double* __restrict dw, double* __restrict db) {
  T* __restrict xh = buf;
  T* __restrict gz = buf + d;     // dL/dz
  T* __restrict z = buf + 2 * d;  // z, then dL/dx-hat
  row_xhat<scalar_t, T>(xr, md, rs, d, xh);
  for (int64_t e = 0; e < d; ++e) gz[e] = static_cast<T>(gr[e]);
  if (l2_eps > 0) {
    bool clamped = false;
    const double inv = row_z<T>(xh, pw, pb, d, l2_eps, z, clamped);
    // (g - y (g . y)) / n with y = z / n, in double: g - y (g . y) cancels where g is along y (at d = 1,
    // wholly), and in float its rounding (2 eps |g| per entry) was what was left: dbias off by 6.35e-6
    // at 2 rows of d = 1 with bias 0.028 (1 / n = 36), where torch's backward of F.normalize was off
    // by 9.5e-7
    const double dot = clamped ? 0.0 : lane_sum<double>(d, [&](int64_t e) {
      return static_cast<double>(gz[e]) * (static_cast<double>(z[e]) * inv);
    });
    for (int64_t e = 0; e < d; ++e)
      gz[e] = static_cast<T>((static_cast<double>(gz[e]) - static_cast<double>(z[e]) * inv * dot) * inv);
  }
  for (int64_t e = 0; e < d; ++e) {
    dw[e] += static_cast<double>(gz[e]) * static_cast<double>(xh[e]);
    db[e] += static_cast<double>(gz[e]);
    z[e] = gz[e] * pw[e];
  }
  const T a1 = lane_sum<T>(d, [&](int64_t e) { return z[e]; }) / static_cast<T>(d);
  const T a2 = lane_sum<T>(d, [&](int64_t e) { return z[e] * xh[e]; }) / static_cast<T>(d);
  for (int64_t e = 0; e < d; ++e) dxr[e] = static_cast<scalar_t>(rs * (z[e] - a1 - xh[e] * a2));
}

}  // namespace

// -> (y [N, d] in dtype, rstd [N] in float (double for float64 x))
std::tuple<at::Tensor, at::Tensor> layer_norm_fwd(const at::Tensor& x_in, const at::Tensor& weight,
                                                              const at::Tensor& bias, double eps,
                                                              std::optional<double> l2_eps_in,
                                                              std::optional<at::ScalarType> dtype) {
  const char* op = "layer_norm";
  check(x_in, weight, bias, op);
  TORCH_CHECK(eps > 0, op, ": eps must be > 0, got ", eps);
  const double l2_eps = check_l2(l2_eps_in, op);
  auto x = x_in.contiguous();
  const int64_t N = x.size(0), d = x.size(1);
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto y = at::empty_like(x, x.options().dtype(dtype.value_or(x.scalar_type())));
  auto rstd = at::empty({N}, x.options().dtype(acc_type));
  dispatch(x.scalar_type(), y.scalar_type(), op, [&](auto in_zero, auto out_zero) {
    using scalar_t = decltype(in_zero);
    using out_t = decltype(out_zero);
    using T = at::opmath_type<scalar_t>;
    const auto w = weight.to(acc_type).contiguous(), b = bias.to(acc_type).contiguous();
    const T *pw = w.data_ptr<T>(), *pb = b.data_ptr<T>();
    const scalar_t* px = x.data_ptr<scalar_t>();
    out_t* py = y.data_ptr<out_t>();
    T* pr = rstd.data_ptr<T>();
    at::parallel_for(0, N, GRAIN, [&](int64_t r0, int64_t r1) {
      std::vector<T> buf(2 * d);  // x-hat, z
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* xr = px + r * d;
        const double md = d ? lane_sum<double>(d, [&](int64_t e) { return static_cast<double>(xr[e]); }) / d : 0.0;
        const double var = lane_sum<double>(d, [&](int64_t e) {
          const double c = static_cast<double>(xr[e]) - md;
          return c * c;
        });
        pr[r] = static_cast<T>(1.0 / std::sqrt((d ? var / d : 0.0) + eps));
        T *xh = buf.data(), *z = xh + d;
        row_xhat<scalar_t, T>(xr, md, pr[r], d, xh);
        out_t* yr = py + r * d;
        if (l2_eps > 0) {
          bool clamped = false;
          const T inv = static_cast<T>(row_z<T>(xh, pw, pb, d, l2_eps, z, clamped));
          for (int64_t e = 0; e < d; ++e) yr[e] = static_cast<out_t>(z[e] * inv);
        } else {
          for (int64_t e = 0; e < d; ++e) yr[e] = static_cast<out_t>(xh[e] * pw[e] + pb[e]);
        }
      }
    });
  });
  return {y, rstd};
}

// -> (dx [N, d] in x's dtype, dweight, dbias in weight's and bias's dtypes)
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_bwd(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                              const at::Tensor& weight, const at::Tensor& bias,
                                                              const at::Tensor& rstd_in,
                                                              std::optional<double> l2_eps_in) {
  const char* op = "layer_norm_backward";
  check(x_in, weight, bias, op);
  const double l2_eps = check_l2(l2_eps_in, op);
  TORCH_CHECK(grad_in.sizes() == x_in.sizes() && grad_in.device().is_cpu(), op, ": grad must be a CPU tensor of x's "
              "shape ", x_in.sizes(), ", got ", grad_in.sizes());
  auto x = x_in.contiguous(), g = grad_in.contiguous();
  const int64_t N = x.size(0), d = x.size(1);
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(rstd_in.numel() == N && rstd_in.scalar_type() == acc_type, op, ": rstd must be [N=", N, "] ", acc_type);
  auto rstd = rstd_in.contiguous();
  auto dx = at::empty_like(x);
  const int64_t chunks = std::max<int64_t>(1, (N + GRAIN - 1) / GRAIN);
  auto partial = at::empty({chunks, 2, d}, x.options().dtype(at::kDouble));  // per chunk: dweight, dbias
  dispatch(x.scalar_type(), g.scalar_type(), op, [&](auto in_zero, auto out_zero) {
    using scalar_t = decltype(in_zero);
    using out_t = decltype(out_zero);
    using T = at::opmath_type<scalar_t>;
    const auto w = weight.to(acc_type).contiguous(), b = bias.to(acc_type).contiguous();
    const T *pw = w.data_ptr<T>(), *pb = b.data_ptr<T>(), *pr = rstd.data_ptr<T>();
    const scalar_t* px = x.data_ptr<scalar_t>();
    const out_t* pg = g.data_ptr<out_t>();
    scalar_t* pdx = dx.data_ptr<scalar_t>();
    double* pp = partial.data_ptr<double>();
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      std::vector<T> buf(3 * d);  // per row: x-hat, dL/dz, z
      for (int64_t c = c0; c < c1; ++c) {
        double *dw = pp + c * 2 * d, *db = dw + d;  // [dweight | dbias] of the chunk
        std::fill(dw, dw + 2 * d, 0.0);
        for (int64_t r = c * GRAIN; r < std::min(N, (c + 1) * GRAIN); ++r) {
          // the forward's double mean, recomputed
          const scalar_t* xr = px + r * d;
          const double md = d ? lane_sum<double>(d, [&](int64_t e) { return static_cast<double>(xr[e]); }) / d : 0.0;
          backward_row<scalar_t, out_t, T>(xr, pg + r * d, pw, pb, md, pr[r], l2_eps, d, buf.data(), pdx + r * d,
                                           dw, db);
        }
      }
    });
  });
  auto sums = partial.sum(0);  // [2, d]
  return {dx, sums[0].to(weight.scalar_type()), sums[1].to(bias.scalar_type())};
}

}  // namespace GRLIB_ISA_NS
#endif
