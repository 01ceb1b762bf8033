// A transposing copy of a matrix: out [n, m] = x [m, n]^T, contiguous (contract and reference:
// grlib/ops/matmul.py, transpose_copy).
//
// Why: oneDNN's GEMM (torch.ops.mkldnn._linear_pointwise) copies a transposed left operand to
// contiguous memory first, and the weight gradient of a linear layer has one (x^T [in, N]). That
// copy (aten's strided copy_) moved about 10 GB/s here; this one works in 16 x 16 blocks that stay
// in registers and cache (both the reads and the writes are runs of 64 bytes), in parallel over
// bands of rows. A copy: the result is bitwise the input's values.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "transpose.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // x [m, n] -> x^T [n, m], contiguous (grlib/ops/matmul.py).
  m.def("transpose_copy(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("transpose_copy", GRLIB_DISPATCH(transpose_copy)); }

#else
namespace GRLIB_ISA_NS {

namespace {

constexpr int64_t B = 16;     // block edge: 16 floats = 64 bytes
constexpr int64_t BAND = 64;  // rows of x per parallel chunk (a multiple of B)

template <typename T>
void transpose_band(const T* __restrict x, int64_t m, int64_t n, int64_t r0, int64_t r1, T* __restrict out) {
  for (int64_t c0 = 0; c0 < n; c0 += B) {
    const int64_t c1 = std::min(n, c0 + B);
    for (int64_t rb = r0; rb < r1; rb += B) {
      const int64_t re = std::min(r1, rb + B);
      if (re - rb == B && c1 - c0 == B) {
        T tile[B][B];
        for (int64_t r = 0; r < B; ++r)
          for (int64_t c = 0; c < B; ++c) tile[c][r] = x[(rb + r) * n + c0 + c];
        for (int64_t c = 0; c < B; ++c) std::memcpy(out + (c0 + c) * m + rb, tile[c], B * sizeof(T));
      } else {
        for (int64_t r = rb; r < re; ++r)
          for (int64_t c = c0; c < c1; ++c) out[c * m + r] = x[r * n + c];
      }
    }
  }
}

at::Tensor transpose_copy(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.dim() == 2, "transpose_copy: x must be a 2-D CPU tensor, got ",
              x_in.dim(), "-D on ", x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({n, m}, x.options());
  if (x.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "transpose_copy", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, (m + BAND - 1) / BAND, 1, [&](int64_t b0, int64_t b1) {
      transpose_band(xp, m, n, b0 * BAND, std::min(m, b1 * BAND), op);
    });
  });
  return out;
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
