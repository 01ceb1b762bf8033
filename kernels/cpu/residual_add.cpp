// The residual sum of a mixed-precision layer on CPU (contract and reference: grlib/ops/fused.py):
//
//   out[i] = x[i] + float(h[i])        x [N] float32 (the residual stream), h [N] bfloat16, float16 or float32
//
// One pass. torch's x + h with a bf16 h first widens h into a float32 copy of its own (a _to_copy
// pass over [T, d]), then adds: at HSTU's paper-like shape ([8192, 1536]) that copy and add took
// longer than the output projection's bias and activation writes together. The sum is computed in
// float32 and rounded once, as torch's add computes it, so the result is bitwise torch's.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "residual_add.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // x + h in float32: x float32, h of x's shape in bfloat16, float16 or float32
  m.def("residual_add(Tensor x, Tensor h) -> Tensor");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("residual_add", GRLIB_DISPATCH(residual_add)); }

#else
namespace GRLIB_ISA_NS {

namespace {

constexpr int64_t GRAIN = 1 << 14;  // elements per chunk

template <typename hid_t>
__attribute__((noinline)) void add_range(const float* __restrict x, const hid_t* __restrict h, float* __restrict out,
                                         int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + static_cast<float>(h[i]);
}

at::Tensor residual_add(const at::Tensor& x_in, const at::Tensor& h_in) {
  const char* op = "residual_add";
  TORCH_CHECK(x_in.device().is_cpu() && h_in.device().is_cpu(), op, ": x and h must be CPU tensors");
  TORCH_CHECK(x_in.scalar_type() == at::kFloat, op, ": x must be float32, got ", x_in.scalar_type());
  TORCH_CHECK(h_in.sizes() == x_in.sizes(), op, ": h must have x's shape ", x_in.sizes(), ", got ", h_in.sizes());
  const at::Tensor x = x_in.contiguous(), h = h_in.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const auto run = [&](auto zero) {
    using hid_t = decltype(zero);
    const hid_t* ph = h.data_ptr<hid_t>();
    at::parallel_for(0, x.numel(), GRAIN, [&](int64_t i0, int64_t i1) {
      add_range<hid_t>(px + i0, ph + i0, po + i0, i1 - i0);
    });
  };
  switch (h.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kBFloat16: run(at::BFloat16{}); break;
    case at::kHalf: run(at::Half{}); break;
    default: TORCH_CHECK(false, op, ": h must be bfloat16, float16 or float32, got ", h.scalar_type());
  }
  return out;
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
