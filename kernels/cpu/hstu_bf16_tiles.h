// bf16 tile products of the jagged HSTU attention (hstu_attention_bf16.cpp), on the avx512 path only:
// bf16 x bf16 products summed in float32, by the AMX tile unit (TMUL) or by AVX512-BF16's vdpbf16ps,
// and the packing that gives them their operands.
//
//   gemm_bf16   C [M, N] (+)= A [M, K] . B [K, N]
//     A: bf16 rows (row stride lda elements);
//     B: "VNNI pairs": row p holds (B[2p, n], B[2p + 1, n]) for n < N, i.e. [K / 2, N, 2] (row stride ldb);
//     C: float32 rows (row stride ldc); M, N multiples of 16, K a multiple of 32; the operands hold
//     (Gemm::blocked: A's columns in blocks of 64, akb elements apart, so that long rows need not be
//     4 KiB and more apart: a tile load of 16 such rows touched 16 pages);
//     zeros wherever the caller padded them.
//
// Both units read the same layouts, so one packing serves both:
//
//   B = K^T  (scores q . k):   pairs of a key row's features = 32-bit words: transpose32 of K's rows
//   B = V    (weights . V):    rows 2p and 2p + 1 of V interleaved entry by entry: pair_rows
//   B = W    (dO^T . W):       two rows of weights rounded to bf16 and interleaved as the backward's
//                              vector pass makes them (hstu_attention_bf16.cpp: tile_backward)
//
// AMX: 8 tile registers of 16 rows x 64 bytes: C in tiles 0-3 (a 32 x 32 block), A in 4-5 (16 rows x 32
// bf16), B in 6-7 (16 pairs x 16 columns); each tdpbf16ps adds a 16 x 16 x 32 product. The tile
// configuration is loaded per task (tile_begin) and released after it (tile_end): other code on the
// same thread (oneDNN) loads its own.
// AVX512-BF16: 6 rows x 4 vectors of 16 float32 accumulators; each vdpbf16ps adds a broadcast pair of
// A times 16 pairs of B.
#include "isa.h"

#include <c10/util/BFloat16.h>

#include "hstu_tiles.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

// once per path (isa.h); code on the avx512 path only
#if defined(GRLIB_ISA_NS) && !defined(GRLIB_HSTU_BF16_TILES_H) && GRLIB_VBYTES == 64
#define GRLIB_HSTU_BF16_TILES_H
#pragma GCC push_options
#pragma GCC target("avx512bf16,amx-tile,amx-bf16")
namespace GRLIB_ISA_NS::hstu::bf16 {

using bf = uint16_t;  // bf16 bits

// ---- AMX ---------------------------------------------------------------------------------------

struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

inline void tile_begin() {
  TileConfig c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  _tile_loadconfig(&c);
}
inline void tile_end() { _tile_release(); }

// C [16 MT, 16 NT] (+)= A [16 MT, K] . B [K, 16 NT] (MT, NT: 1 or 2)
template <int MT, int NT>
inline void amx_block(int64_t K, const bf* A, int64_t lda, int64_t akb, const bf* B, int64_t ldb, float* C, int64_t ldc,
                      bool add) {
  const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
  if (add) {
    _tile_loadd(0, C, sc);
    if constexpr (NT > 1) _tile_loadd(1, C + 16, sc);
    if constexpr (MT > 1) _tile_loadd(2, C + 16 * ldc, sc);
    if constexpr (MT > 1 && NT > 1) _tile_loadd(3, C + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NT > 1) _tile_zero(1);
    if constexpr (MT > 1) _tile_zero(2);
    if constexpr (MT > 1 && NT > 1) _tile_zero(3);
  }
  for (int64_t k = 0; k < K; k += 32) {
    const bf* a = A + k / 64 * akb + k % 64;
    _tile_loadd(4, a, sa);
    _tile_loadd(6, B + k / 2 * ldb, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT > 1) {
      _tile_loadd(7, B + k / 2 * ldb + 32, sb);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MT > 1) {
      _tile_loadd(5, a + 16 * lda, sa);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NT > 1) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, C, sc);
  if constexpr (NT > 1) _tile_stored(1, C + 16, sc);
  if constexpr (MT > 1) _tile_stored(2, C + 16 * ldc, sc);
  if constexpr (MT > 1 && NT > 1) _tile_stored(3, C + 16 * ldc + 16, sc);
}

inline void gemm_amx(int64_t M, int64_t N, int64_t K, const bf* A, int64_t lda, int64_t akb, const bf* B,
                     int64_t ldb, float* C, int64_t ldc, bool add) {
  for (int64_t m = 0; m < M; m += 32) {
    const bool m2 = m + 32 <= M;
    for (int64_t n = 0; n < N; n += 32) {
      const bool n2 = n + 32 <= N;
      const bf *a = A + m * lda, *b = B + n * 2;
      float* c = C + m * ldc + n;
      if (m2 && n2) amx_block<2, 2>(K, a, lda, akb, b, ldb, c, ldc, add);
      else if (m2) amx_block<2, 1>(K, a, lda, akb, b, ldb, c, ldc, add);
      else if (n2) amx_block<1, 2>(K, a, lda, akb, b, ldb, c, ldc, add);
      else amx_block<1, 1>(K, a, lda, akb, b, ldb, c, ldc, add);
    }
  }
}

// ---- AVX512-BF16 -------------------------------------------------------------------------------

// C [R, 16 NV] (+)= A [R, K] . B [K, 16 NV]
template <int R, int NV>
inline void dp_block(int64_t K, const bf* A, int64_t lda, int64_t akb, const bf* B, int64_t ldb, float* C, int64_t ldc,
                     bool add) {
  __m512 acc[R][NV];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = add ? _mm512_loadu_ps(C + i * ldc + 16 * v) : _mm512_setzero_ps();
  for (int64_t p = 0; p < K / 2; ++p) {
    __m512bh b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = (__m512bh)_mm512_loadu_si512(B + p * ldb + 32 * v);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      int32_t pair;
      std::memcpy(&pair, A + i * lda + 2 * p / 64 * akb + 2 * p % 64, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + i * ldc + 16 * v, acc[i][v]);
}

template <int R>
inline void dp_rows(int64_t N, int64_t K, const bf* A, int64_t lda, int64_t akb, const bf* B, int64_t ldb, float* C,
                    int64_t ldc, bool add) {
  int64_t n = 0;
  for (; n + 64 <= N; n += 64) dp_block<R, 4>(K, A, lda, akb, B + 2 * n, ldb, C + n, ldc, add);
  if (n + 32 <= N) dp_block<R, 2>(K, A, lda, akb, B + 2 * n, ldb, C + n, ldc, add), n += 32;
  if (n < N) dp_block<R, 1>(K, A, lda, akb, B + 2 * n, ldb, C + n, ldc, add);
}

inline void gemm_dp(int64_t M, int64_t N, int64_t K, const bf* A, int64_t lda, int64_t akb, const bf* B, int64_t ldb,
                    float* C, int64_t ldc, bool add) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) dp_rows<6>(N, K, A + m * lda, lda, akb, B, ldb, C + m * ldc, ldc, add);
  if (m + 4 <= M) dp_rows<4>(N, K, A + m * lda, lda, akb, B, ldb, C + m * ldc, ldc, add), m += 4;
  if (m + 2 <= M) dp_rows<2>(N, K, A + m * lda, lda, akb, B, ldb, C + m * ldc, ldc, add), m += 2;
  if (m < M) dp_rows<1>(N, K, A + m * lda, lda, akb, B, ldb, C + m * ldc, ldc, add);
}

// The product of the units this pass runs on (isa::units(): AMX or DPBF16).
struct Gemm {
  bool amx;
  void operator()(int64_t M, int64_t N, int64_t K, const bf* A, int64_t lda, const bf* B, int64_t ldb, float* C,
                  int64_t ldc, bool add) const {
    blocked(M, N, K, A, lda, 64, B, ldb, C, ldc, add);
  }
  // A in blocks of 64 columns (K), `akb` elements apart (a plain row: akb = 64)
  void blocked(int64_t M, int64_t N, int64_t K, const bf* A, int64_t lda, int64_t akb, const bf* B, int64_t ldb,
               float* C, int64_t ldc, bool add) const {
    if (amx)
      gemm_amx(M, N, K, A, lda, akb, B, ldb, C, ldc, add);
    else
      gemm_dp(M, N, K, A, lda, akb, B, ldb, C, ldc, add);
  }
  void begin() const {
    if (amx) tile_begin();
  }
  void end() const {
    if (amx) tile_end();
  }
};

// ---- rounding and packing ----------------------------------------------------------------------

inline bf round1(float x) { return c10::BFloat16(x).x; }  // round to nearest even (NaN kept)
inline float widen1(bf x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// dst[e] = bf16(src[e]) for e < n (round to nearest even)
inline void round_row(const float* src, bf* dst, int64_t n) {
  int64_t e = 0;
  for (; e + 16 <= n; e += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + e), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + e)));
  for (; e < n; ++e) dst[e] = round1(src[e]);
}

// dst[e] = float(src[e]) for e < n
inline void widen_row(const bf* src, float* dst, int64_t n) {
  int64_t e = 0;
  for (; e + 16 <= n; e += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + e)));
    _mm512_storeu_ps(dst + e, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
  for (; e < n; ++e) dst[e] = widen1(src[e]);
}

// dst[c * ldd + r] = src[r * lds + c] for 32-bit words, r < R (a multiple of 16), c < Cn (a multiple of
// 16): bf16 pairs moved whole (transpose16 of hstu_tiles.h on their bits).
inline void transpose32(const bf* src, int64_t lds, int64_t R, int64_t Cn, bf* dst, int64_t ldd) {
  const float* s = reinterpret_cast<const float*>(src);
  float* d = reinterpret_cast<float*>(dst);
  for (int64_t r = 0; r < R; r += 16)
    for (int64_t c = 0; c < Cn; c += 16) transpose16(s + r * (lds / 2) + c, lds / 2, d + c * (ldd / 2) + r, ldd / 2);
}

// VNNI pairs of rows: dst[p, e, t] = src[2p + t, e] for p < R / 2 (R even), e < E (a multiple of 32);
// dst row stride 2 E.
inline void pair_rows(const bf* src, int64_t lds, int64_t R, int64_t E, bf* dst) {
  alignas(64) static const uint16_t lo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                              8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                              24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i ilo = _mm512_load_si512(lo), ihi = _mm512_load_si512(hi);
  for (int64_t p = 0; p < R / 2; ++p) {
    const bf *a = src + 2 * p * lds, *b = a + lds;
    bf* d = dst + p * 2 * E;
    for (int64_t e = 0; e < E; e += 32) {
      const __m512i x = _mm512_loadu_si512(a + e), y = _mm512_loadu_si512(b + e);
      _mm512_storeu_si512(d + 2 * e, _mm512_permutex2var_epi16(x, ilo, y));
      _mm512_storeu_si512(d + 2 * e + 32, _mm512_permutex2var_epi16(x, ihi, y));
    }
  }
}

}  // namespace GRLIB_ISA_NS::hstu::bf16
#pragma GCC pop_options
#endif
