// Dropout from 16-bit random words, applied in one pass (contract and reference: grlib/ops/dropout.py;
// the words are drawn in grlib/model/dropout.py), and the words themselves.
//
//   out[i] = words[i] >= threshold ? x[i] * scale : 0        words [N] int16, x [N]
//
// The same arithmetic as the PyTorch form x * (words >= threshold) * scale (a kept element is
// x * 1 * scale = x * scale, a dropped one x * 0 * scale = +-0), without the bool mask, its
// conversion to x's dtype and the second product as separate passes over memory. The backward
// applies the same op to the gradient.
//
//   random_words: word e of a [rows, inner] block = bits 16 (e % 4) .. 16 (e % 4) + 15 of
//   splitmix64(seed, e / 4), e = row * inner + j (row: the row's index in the whole batch, `rows`
//   when given), splitmix64(seed, i) = mix(seed + (i + 1) * 0x9E3779B97F4A7C15) (the (i + 1)-th output
//   of SplittableRandom seeded with seed). A counter-based stream: any element's word without the
//   ones before it, so the rows of a data-parallel rank are drawn alone, and the work splits over threads.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include "isa.h"

#include <cstring>
#include <optional>

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "dropout.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // x * (words >= threshold) * scale in one pass; words [numel(x)] int16 (grlib/ops/dropout.py).
  m.def("dropout_words(Tensor x, Tensor words, int threshold, float scale) -> Tensor");
  // [n_rows, inner] int16 words of the splitmix64 stream of seed (a 0-dim int64 tensor); rows [n_rows]
  // int64: each row's index in the whole batch (None: 0 .. n_rows - 1)
  m.def("random_words(Tensor seed, int n_rows, int inner, Tensor? rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("dropout_words", GRLIB_DISPATCH(dropout_words));
  m.impl("random_words", GRLIB_DISPATCH(random_words));
}

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

inline uint64_t splitmix64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

at::Tensor random_words(const at::Tensor& seed_in, int64_t n_rows, int64_t inner,
                        const std::optional<at::Tensor>& rows_in) {
  const char* op = "random_words";
  TORCH_CHECK(seed_in.device().is_cpu() && seed_in.scalar_type() == at::kLong && seed_in.numel() == 1, op,
              ": seed must be one int64 on the CPU, got ", seed_in.scalar_type(), " ", seed_in.sizes());
  TORCH_CHECK(n_rows >= 0 && inner >= 0, op, ": n_rows and inner must be >= 0, got ", n_rows, " and ", inner);
  at::Tensor rows;
  if (rows_in) {
    rows = rows_in->contiguous();
    TORCH_CHECK(rows.device().is_cpu() && rows.scalar_type() == at::kLong && rows.dim() == 1 && rows.numel() == n_rows,
                op, ": rows must be int64 [n_rows=", n_rows, "] on the CPU, got ", rows.scalar_type(), " ",
                rows.sizes());
  }
  const uint64_t seed = static_cast<uint64_t>(seed_in.item<int64_t>());
  at::Tensor out = at::empty({n_rows, inner}, seed_in.options().dtype(at::kShort));
  int16_t* po = out.data_ptr<int16_t>();
  const int64_t* pr = rows_in ? rows.data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, n_rows, std::max<int64_t>(1, GRAIN / std::max<int64_t>(inner, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const uint64_t base = static_cast<uint64_t>(pr ? pr[r] : r) * static_cast<uint64_t>(inner);  // e of j = 0
      int16_t* o = po + r * inner;
      const auto word = [&](int64_t j) {
        const uint64_t e = base + static_cast<uint64_t>(j);
        return static_cast<int16_t>(static_cast<uint16_t>(splitmix64(seed, e >> 2) >> (16 * (e & 3))));
      };
      int64_t j = 0;
      for (; j < inner && ((base + j) & 3); ++j) o[j] = word(j);  // up to the next output's first word
      // whole outputs: four words (low 16 bits first) stored as one little-endian 64-bit value
      const int64_t n4 = (inner - j) / 4;
      const uint64_t i0 = (base + j) >> 2;
      int16_t* o4 = o + j;
      uint64_t block[64];  // computed in a buffer of its own (a loop the compiler vectorises), then copied
      for (int64_t q0 = 0; q0 < n4; q0 += 64) {
        const int64_t nq = std::min<int64_t>(64, n4 - q0);
        for (int64_t q = 0; q < nq; ++q) block[q] = splitmix64(seed, i0 + static_cast<uint64_t>(q0 + q));
        std::memcpy(o4 + 4 * q0, block, 8 * nq);
      }
      for (j += 4 * n4; j < inner; ++j) o[j] = word(j);
    }
  });
  return out;
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
