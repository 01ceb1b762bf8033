// Dropout from 16-bit random words, applied in one pass (contract and reference: grlib/ops/dropout.py;
// the words are drawn in grlib/model/dropout.py).
//
//   out[i] = words[i] >= threshold ? x[i] * scale : 0        words [N] int16, x [N]
//
// The same arithmetic as the PyTorch form x * (words >= threshold) * scale (a kept element is
// x * 1 * scale = x * scale, a dropped one x * 0 * scale = +-0), without the bool mask, its
// conversion to x's dtype and the second product as separate passes over memory. The backward
// applies the same op to the gradient.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "dropout.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // x * (words >= threshold) * scale in one pass; words [numel(x)] int16 (grlib/ops/dropout.py).
  m.def("dropout_words(Tensor x, Tensor words, int threshold, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("dropout_words", GRLIB_DISPATCH(dropout_words)); }

#else
namespace GRLIB_ISA_NS {

namespace {

constexpr int64_t GRAIN = 1 << 14;  // elements per chunk

at::Tensor dropout_words(const at::Tensor& x_in, const at::Tensor& words_in, int64_t threshold, double scale) {
  const char* op = "dropout_words";
  TORCH_CHECK(x_in.device().is_cpu() && words_in.device().is_cpu(), op, ": x and words must be CPU tensors");
  TORCH_CHECK(at::isFloatingType(x_in.scalar_type()), op, ": x must be floating point, got ", x_in.scalar_type());
  TORCH_CHECK(words_in.scalar_type() == at::kShort && words_in.numel() == x_in.numel(), op,
              ": words must be int16 with one word per element of x (", x_in.numel(), "), got ", words_in.numel(),
              " ", words_in.scalar_type());
  TORCH_CHECK(threshold >= -32768 && threshold <= 32768, op, ": threshold must be in [-32768, 32768], got ", threshold);
  const at::Tensor x = x_in.contiguous(), words = words_in.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int16_t* w = words.data_ptr<int16_t>();
  const int32_t thr = static_cast<int32_t>(threshold);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dropout_words", [&] {
    using C = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    const C s = static_cast<C>(scale);  // as torch multiplies by a Python float: in x's compute type
    at::parallel_for(0, x.numel(), GRAIN, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const C keep = static_cast<int32_t>(w[i]) >= thr ? C(1) : C(0);
        op_[i] = static_cast<scalar_t>(static_cast<C>(static_cast<scalar_t>(static_cast<C>(xp[i]) * keep)) * s);
      }
    });
  });
  return out;
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
