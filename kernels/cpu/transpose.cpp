// A transposing copy of a matrix: out [n, m] = x [m, n]^T, contiguous (contract and reference:
// grlib/ops/matmul.py, transpose_copy).
//
// Why: oneDNN's GEMM (torch.ops.mkldnn._linear_pointwise) copies a transposed left operand to
// contiguous memory first, and the weight gradient of a linear layer has one (x^T [in, N]). That
// copy (aten's strided copy_) moved about 10 GB/s here; this one works in 16 x 16 blocks that stay
// in registers and cache (both the reads and the writes are runs of 64 bytes), in parallel over
// bands of rows. A copy: the result is bitwise the input's values.
// On the avx512 path the full blocks go through vector registers: 4-byte types in 16 x 16 blocks
// (hstu_tiles.h's transpose16), 2-byte types (bf16, fp16) in 32 x 32 blocks, as 32-bit pairs
// transposed by transpose16 and then split into even and odd columns (transpose32_16). The scalar
// 16 x 16 blocks moved bf16 [8192, 1536] at about 3.4 GB/s on the 2-core AMX Xeon (14.5 ms).
// Two things the linear layer's weight gradient needs ride along: a last row of ones (ones_row: the
// dW product's extra row is db) and bf16 -> float32 (dtype: a bf16 product's dW written in its float32
// parameter's layout, streamed). In the paper-like bf16 step's profile (docs/MEASUREMENTS.md,
// 2026-12-06) they removed aten::cat (8.5-8.9 ms) and 6-7 ms of aten::copy_ for 1-2 ms more here.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include "isa.h"
#include "hstu_tiles.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "transpose.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // x [m, n] -> x^T [n, m], contiguous; ones_row: [n + 1, m], the last row ones; dtype: x's, or float32
  // from bfloat16 (widened as it is moved) (grlib/ops/matmul.py).
  m.def("transpose_copy(Tensor x, bool ones_row=False, ScalarType? dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("transpose_copy", GRLIB_DISPATCH(transpose_copy)); }

#else
namespace GRLIB_ISA_NS {

namespace {

constexpr int64_t B = 16;     // block edge: 16 floats = 64 bytes
constexpr int64_t BAND = 64;  // rows of x per parallel chunk (a multiple of B)

#if GRLIB_VBYTES == 64
// out[c, r] = x[r, c] for a 32 x 32 block of 2-byte entries (x, out: row strides lx, lo in entries).
// transpose16 of the 32-bit pairs gives, per pair of columns (2w, 2w + 1), a row of 16 row-pairs
// (x[r, 2w], x[r, 2w + 1]) for each half of the rows; the even entries of the two halves are out's
// row 2w, the odd ones row 2w + 1.
// Widen (bf16 -> float32): each output row of 32 entries becomes two vectors of 16 floats (the bf16
// bits shifted into the high half of each float), the same values.
template <typename O>
inline void transpose32_16(const uint16_t* x, int64_t lx, O* out, int64_t lo) {
  static_assert(sizeof(O) == 2 || std::is_same_v<O, float>, "2-byte entries, or bf16 widened to float");
  alignas(64) float half[2][16 * 16];
  for (int h = 0; h < 2; ++h)
    hstu::transpose16(reinterpret_cast<const float*>(x + 16 * h * lx), lx / 2, half[h], 16);
  alignas(64) static const uint16_t even[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                                32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  const __m512i ie = _mm512_load_si512(even), io = _mm512_add_epi16(ie, _mm512_set1_epi16(1));
  // whole aligned cache lines: streamed (no read of the line first, none of the output kept in cache)
  const bool stream = reinterpret_cast<uintptr_t>(out) % 64 == 0 && lo % 32 == 0;
  const bool wstream = reinterpret_cast<uintptr_t>(out) % 64 == 0 && lo % 16 == 0;  // float rows
  for (int w = 0; w < 16; ++w) {
    const __m512i a = _mm512_load_si512(half[0] + 16 * w), b = _mm512_load_si512(half[1] + 16 * w);
    const __m512i ev = _mm512_permutex2var_epi16(a, ie, b), od = _mm512_permutex2var_epi16(a, io, b);
    if constexpr (std::is_same_v<O, float>) {
      const __m512i rows[2] = {ev, od};
      for (int t = 0; t < 2; ++t)
        for (int k = 0; k < 2; ++k) {
          const __m256i bits = k ? _mm512_extracti64x4_epi64(rows[t], 1) : _mm512_castsi512_si256(rows[t]);
          const __m512i f = _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16);
          if (wstream)
            _mm512_stream_si512(reinterpret_cast<__m512i*>(out + (2 * w + t) * lo + 16 * k), f);
          else
            _mm512_storeu_si512(out + (2 * w + t) * lo + 16 * k, f);
        }
    } else if (stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + 2 * w * lo), ev);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + (2 * w + 1) * lo), od);
    } else {
      _mm512_storeu_si512(out + 2 * w * lo, ev);
      _mm512_storeu_si512(out + (2 * w + 1) * lo, od);
    }
  }
}

// The full blocks of rows r0 .. r1 (a band) in vector registers; returns the first row left to the
// scalar blocks (the band's rows past its last full block; columns past the last full block are
// left to them too: cols_done).
template <typename T, typename O>
int64_t transpose_band_vec(const T* __restrict x, int64_t m, int64_t n, int64_t r0, int64_t r1, O* __restrict out,
                           int64_t& cols_done) {
  cols_done = 0;
  if constexpr (sizeof(T) == 4 && std::is_same_v<T, O>) {
    const int64_t rf = r0 + (r1 - r0) / 16 * 16;
    cols_done = n / 16 * 16;
    for (int64_t c0 = 0; c0 < cols_done; c0 += 16)
      for (int64_t r = r0; r < rf; r += 16)
        hstu::transpose16(reinterpret_cast<const float*>(x + r * n + c0), n, reinterpret_cast<float*>(out + c0 * m + r),
                          m);
    return rf;
  } else if constexpr (sizeof(T) == 2 && (std::is_same_v<T, O> || std::is_same_v<T, c10::BFloat16>)) {
    if (n % 2) return r0;  // the pairs need an even row length (whole 32-bit words)
    const int64_t rf = r0 + (r1 - r0) / 32 * 32;
    cols_done = n / 32 * 32;
    using Bits = std::conditional_t<std::is_same_v<O, float>, float, uint16_t>;
    for (int64_t c0 = 0; c0 < cols_done; c0 += 32)
      for (int64_t r = r0; r < rf; r += 32)
        transpose32_16(reinterpret_cast<const uint16_t*>(x + r * n + c0), n, reinterpret_cast<Bits*>(out + c0 * m + r),
                       m);
    return rf;
  }
  return r0;
}
#endif

template <typename T, typename O>
void transpose_scalar(const T* __restrict x, int64_t m, int64_t n, int64_t r0, int64_t r1, int64_t c_from,
                      O* __restrict out) {
  for (int64_t c0 = c_from; c0 < n; c0 += B) {
    const int64_t c1 = std::min(n, c0 + B);
    for (int64_t rb = r0; rb < r1; rb += B) {
      const int64_t re = std::min(r1, rb + B);
      if (re - rb == B && c1 - c0 == B) {
        O tile[B][B];
        for (int64_t r = 0; r < B; ++r)
          for (int64_t c = 0; c < B; ++c) tile[c][r] = static_cast<O>(x[(rb + r) * n + c0 + c]);
        for (int64_t c = 0; c < B; ++c) std::memcpy(out + (c0 + c) * m + rb, tile[c], B * sizeof(O));
      } else {
        for (int64_t r = rb; r < re; ++r)
          for (int64_t c = c0; c < c1; ++c) out[c * m + r] = static_cast<O>(x[r * n + c]);
      }
    }
  }
}

template <typename T, typename O>
void transpose_band(const T* __restrict x, int64_t m, int64_t n, int64_t r0, int64_t r1, O* __restrict out) {
#if GRLIB_VBYTES == 64
  int64_t cols_done = 0;
  const int64_t rf = transpose_band_vec(x, m, n, r0, r1, out, cols_done);
  if (cols_done > 0 && rf > r0) transpose_scalar(x, m, n, r0, rf, cols_done, out);  // the columns past them
  transpose_scalar(x, m, n, rf > r0 && cols_done > 0 ? rf : r0, r1, 0, out);         // the rows past them
#else
  transpose_scalar(x, m, n, r0, r1, 0, out);
#endif
}

template <typename T, typename O>
void transpose_all(const at::Tensor& x, at::Tensor& out) {
  const int64_t m = x.size(0), n = x.size(1);
  const T* xp = x.data_ptr<T>();
  O* op = out.data_ptr<O>();
  at::parallel_for(0, (m + BAND - 1) / BAND, 1, [&](int64_t b0, int64_t b1) {
    transpose_band(xp, m, n, b0 * BAND, std::min(m, b1 * BAND), op);
#if GRLIB_VBYTES == 64
    _mm_sfence();  // the streamed stores visible before the result is used
#endif
  });
}

at::Tensor transpose_copy(const at::Tensor& x_in, bool ones_row, std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.dim() == 2, "transpose_copy: x must be a 2-D CPU tensor, got ",
              x_in.dim(), "-D on ", x_in.device());
  const at::ScalarType to = dtype.value_or(x_in.scalar_type());
  const bool widen = to != x_in.scalar_type();
  TORCH_CHECK(!widen || (x_in.scalar_type() == at::kBFloat16 && to == at::kFloat),
              "transpose_copy: dtype must be x's or, for bfloat16 x, float32; got ", x_in.scalar_type(), " -> ", to);
  const at::Tensor x = x_in.contiguous();
  const int64_t m = x.size(0), n = x.size(1);
  // ones_row: the row of ones that turns a linear layer's dW product into db as well (grlib/ops/matmul.py);
  // appended by a cat, it took 8.5 ms of the paper-like bf16 step (a copy of x^T). widen: the weight
  // gradient of a bf16 product, transposed into its float32 parameter's layout in the same pass.
  at::Tensor out = at::empty({n + (ones_row ? 1 : 0), m}, x.options().dtype(to));
  if (ones_row) out.select(0, n).fill_(1);
  if (x.numel() == 0) return out;
  if (widen) {
    transpose_all<c10::BFloat16, float>(x, out);
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "transpose_copy",
                                  [&] { transpose_all<scalar_t, scalar_t>(x, out); });
  return out;
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
