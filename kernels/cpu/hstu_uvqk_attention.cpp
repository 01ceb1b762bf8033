// HSTU's SiLU, split and attention fused: z [T, 4d] = the uvqk projection (columns u | v | q | k).
// The attention (hstu_attention.h) reads column blocks of z as strided [T, H, d / H] views and applies
// SiLU while packing its tiles; its backward writes dz's column blocks directly.
#include "hstu_attention.h"
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "hstu_uvqk_attention.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("hstu_uvqk_attention", GRLIB_DISPATCH(hstu::hstu_uvqk_attention_fwd));
  m.impl("hstu_uvqk_attention_backward", GRLIB_DISPATCH(hstu::hstu_uvqk_attention_bwd));
}

#else
namespace GRLIB_ISA_NS {

namespace hstu {
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
      for (int64_t r = r0; r < r1; ++r) silu_row(zp + r * rz, up + r * d, d, C(1));
    });
  });
  out = forward(a, alpha);  // the same dtype: q, k, v are views of z
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
  });
  backward(op, mode, a, alpha, grad, dq, dk, dv, dpos, dtime);
  return {dz, dpos, dtime};
}

}  // namespace hstu

}  // namespace GRLIB_ISA_NS
#endif
