// Fused LayerNorm(x) * u on CPU, forward and backward: the HSTU step after attention,
// Y = W2 . (LayerNorm(A V) * U), without the [N, d] LayerNorm output in between.
//
//   y = ((x - mean) * rstd * weight + bias) * u        x, u [N, d]; weight, bias [d]
//
// Rows are independent (OpenMP over row chunks through at::parallel_for). Row statistics are
// accumulated in double, the rest in float (double for float64 inputs); forward returns mean and
// rstd [N] in float (double) for the backward pass, which recomputes the normalised row instead of storing it. The
// weight/bias gradients are summed per row chunk into a partial buffer of its own and reduced
// afterwards (race-free), in double.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

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
constexpr int64_t LANES = 8;   // independent partial sums, so that the compiler can vectorise reductions

// sum_e f(e) for e < d in double, over LANES interleaved partial sums (no -ffast-math needed).
template <typename F>
inline double lane_sum(int64_t d, const F& f) {
  double acc[LANES] = {};
  int64_t e = 0;
  for (; e + LANES <= d; e += LANES)
    for (int64_t l = 0; l < LANES; ++l) acc[l] += f(e + l);
  for (; e < d; ++e) acc[0] += f(e);
  double total = 0;
  for (int64_t l = 0; l < LANES; ++l) total += acc[l];
  return total;
}

}  // namespace

// -> (y [N, d], mean [N], rstd [N]); mean/rstd in float (double for float64 x)
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_fwd(const at::Tensor& x_in, const at::Tensor& u_in,
                                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                                  double eps) {
  check(x_in, u_in, weight, bias, "layer_norm_mul");
  TORCH_CHECK(eps > 0, "layer_norm_mul: eps must be > 0, got ", eps);
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
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t *xr = px + r * d, *ur = pu + r * d;
        // row statistics in double: rows far from zero mean keep their digits
        const double md = d ? lane_sum(d, [&](int64_t e) { return static_cast<double>(xr[e]); }) / d : 0.0;
        const double var = lane_sum(d, [&](int64_t e) {
          const double c = static_cast<double>(xr[e]) - md;
          return c * c;
        });
        pm[r] = static_cast<T>(md);
        pr[r] = static_cast<T>(1.0 / std::sqrt((d ? var / d : 0.0) + eps));
        const T m = pm[r], rs = pr[r];
        for (int64_t e = 0; e < d; ++e)
          py[r * d + e] = static_cast<scalar_t>(((static_cast<T>(xr[e]) - m) * rs * pw[e] + pb[e]) * static_cast<T>(ur[e]));
      }
    });
  });
  return {y, mean, rstd};
}

// -> (dx, du, dweight, dbias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> layer_norm_mul_bwd(
    const at::Tensor& grad_in, const at::Tensor& x_in, const at::Tensor& u_in, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& mean_in, const at::Tensor& rstd_in) {
  check(x_in, u_in, weight, bias, "layer_norm_mul_backward");
  TORCH_CHECK(grad_in.sizes() == x_in.sizes() && grad_in.scalar_type() == x_in.scalar_type(),
              "layer_norm_mul_backward: grad must match x ", x_in.sizes(), " ", x_in.scalar_type(), ", got ",
              grad_in.sizes(), " ", grad_in.scalar_type());
  auto x = x_in.contiguous(), u = u_in.contiguous(), g = grad_in.contiguous();
  const int64_t N = x.size(0), d = x.size(1);
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(mean_in.numel() == N && rstd_in.numel() == N && mean_in.scalar_type() == acc_type &&
                  rstd_in.scalar_type() == acc_type,
              "layer_norm_mul_backward: mean and rstd must be [N=", N, "] ", acc_type);
  auto mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  auto dx = at::empty_like(x), du = at::empty_like(u);
  const int64_t chunks = std::max<int64_t>(1, (N + GRAIN - 1) / GRAIN);
  // per chunk: dweight, dbias partial sums, in double (sums over many rows)
  auto partial = at::zeros({chunks, 2, d}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "layer_norm_mul_backward", [&] {
    using T = at::opmath_type<scalar_t>;
    const auto w = weight.to(acc_type).contiguous(), b = bias.to(acc_type).contiguous();
    const T *pw = w.data_ptr<T>(), *pb = b.data_ptr<T>(), *pr = rstd.data_ptr<T>();
    const scalar_t *px = x.data_ptr<scalar_t>(), *pu = u.data_ptr<scalar_t>(), *pg = g.data_ptr<scalar_t>();
    scalar_t *pdx = dx.data_ptr<scalar_t>(), *pdu = du.data_ptr<scalar_t>();
    double* pp = partial.data_ptr<double>();
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      std::vector<T> xhat(d), dxhat(d);
      for (int64_t c = c0; c < c1; ++c) {
        double *dw = pp + c * 2 * d, *db = dw + d;
        for (int64_t r = c * GRAIN; r < std::min(N, (c + 1) * GRAIN); ++r) {
          const scalar_t *xr = px + r * d, *ur = pu + r * d, *gr = pg + r * d;
          // the row mean again in double: x - mean loses digits for rows far from zero mean when
          // the mean is rounded to float first, and dweight sums those errors over every row
          const double md = lane_sum(d, [&](int64_t e) { return static_cast<double>(xr[e]); }) / d;
          const double rs_d = static_cast<double>(pr[r]);
          const T rs = pr[r];
          for (int64_t e = 0; e < d; ++e) {
            const double xhd = (static_cast<double>(xr[e]) - md) * rs_d;
            const T xh = static_cast<T>(xhd), gv = static_cast<T>(gr[e]);
            const T gl = gv * static_cast<T>(ur[e]);  // dL/d LayerNorm(x)
            pdu[r * d + e] = static_cast<scalar_t>(gv * (xh * pw[e] + pb[e]));
            dw[e] += static_cast<double>(gl) * xhd;
            db[e] += gl;
            xhat[e] = xh;
            dxhat[e] = gl * pw[e];
          }
          const double sum_dxhat = lane_sum(d, [&](int64_t e) { return static_cast<double>(dxhat[e]); });
          const double sum_dxhat_xhat = lane_sum(d, [&](int64_t e) { return static_cast<double>(dxhat[e] * xhat[e]); });
          const T a1 = static_cast<T>(sum_dxhat / d), a2 = static_cast<T>(sum_dxhat_xhat / d);
          for (int64_t e = 0; e < d; ++e)
            pdx[r * d + e] = static_cast<scalar_t>(rs * (dxhat[e] - a1 - xhat[e] * a2));
        }
      }
    });
  });
  auto sums = partial.sum(0);  // [2, d]
  return {dx, du, sums[0].to(weight.scalar_type()), sums[1].to(bias.scalar_type())};
}

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // y = LayerNorm(x; weight, bias, eps) * u over the last dim of x, u [N, d]
  m.def("layer_norm_mul(Tensor x, Tensor u, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("layer_norm_mul_backward(Tensor grad, Tensor x, Tensor u, Tensor weight, Tensor bias, Tensor mean, "
        "Tensor rstd) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("layer_norm_mul", &layer_norm_mul_fwd);
  m.impl("layer_norm_mul_backward", &layer_norm_mul_bwd);
}
