// bf16 jagged HSTU attention on the CPU's bf16 units (the avx512 path with AMX or AVX512-BF16;
// isa.h's units): the same tasks and tiles as the float32 kernels (design: hstu_attention.h), with
// every tile product in bf16 x bf16 -> float32 (hstu_bf16_tiles.h). What stays float32: the score and
// dL/dweight tiles the products give, alpha, the biases, SiLU and SiLU' and their gradients (the
// same vector code as the float32 kernels), every accumulator (O, dQ, dK^T, dV^T) and the bias
// gradients. What is rounded to bf16 for a product (round to nearest even), as flash attention does:
// the attention weights W and dL/dscores dS of a tile, SiLU(q), SiLU(k), SiLU(v) in the fused uvqk op.
//
// Layouts (Dk, Dvk: D, Dv rounded up to 32; Lp: the longest sequence rounded up to BLK):
//
//   forward, per task (a sequence and head, or one query tile of it):
//     KT  [Dk / 2, Lp] bf16 pairs   every key's features (B of S = Q K^T)
//     VP  [Lp / 2, Dvk, 2]          V's rows in pairs (B of O += W V)
//     per query tile: Q [BLK, Dk]; S [BLK, BLK] float32 -> W [BLK, BLK] bf16; O [BLK, Dvk] float32
//   backward, per (sequence, head) (one pass) or per query tile (dq pass) and key tile (dk/dv pass):
//     S = Q K^T, dW = dO V^T (float32) -> W, dS (float32) -> dS bf16 [query, key] and W, dS in pairs of
//     query rows, so that dQ += dS K (B: K's rows in pairs), dV^T += dO^T W and dK^T += Q^T dS
//     (A: Q^T, dO^T [D, queries], transposed once per sequence or tile).
// alpha scales S in float32 (q is multiplied raw) and dQ, dK as they are written.
#include "hstu_attention.h"
#include "hstu_bf16_tiles.h"
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h); code on the avx512 path only
#define GRLIB_ISA_SELF "hstu_attention_bf16.cpp"
#include "isa_paths.h"

#elif GRLIB_VBYTES == 64
#pragma GCC push_options
#pragma GCC target("avx512bf16,amx-tile,amx-bf16")
namespace GRLIB_ISA_NS::hstu {
namespace {

using bf16::bf;
using bf16::Gemm;
using T = float;
using scalar_t = at::BFloat16;

inline const bf* bits(const scalar_t* p) { return reinterpret_cast<const bf*>(p); }

// Per-worker scratch carved into float32 and bf16 regions (sizes in elements, each rounded to 16 floats).
struct Carve {
  float* at;
  float* f32(int64_t n) {
    float* p = at;
    at += round_up(n, 16);
    return p;
  }
  bf* b16(int64_t n) { return reinterpret_cast<bf*>(f32((n + 1) / 2)); }
  static int64_t floats(std::initializer_list<int64_t> f32s, std::initializer_list<int64_t> b16s) {
    int64_t n = 0;
    for (int64_t x : f32s) n += round_up(x, 16);
    for (int64_t x : b16s) n += round_up((x + 1) / 2, 16);
    return n;
  }
};

// SiLU's parts for the weights and their gradients, sized for values rounded to bf16 next (relative
// error u = 2^-9): e = e^-v and r = 1 / (1 + e) = sigmoid(v), so that SiLU(v) = v r and SiLU'(v) =
// r (1 + v (1 - r)) = r (1 + v e r) (1 - r = e r without the cancellation of 1 - r near r = 1).
//   e: 2^t, t = min(-v log2 e, 125), as 2^(t - n) by a degree-4 polynomial (fitted for relative error
//      on [-1/2, 1/2]: 2.7e-6) scaled by 2^n (vscalefps: n = round(t)); the cap keeps r a normal float.
//   r: vrcp14ps (relative error below 2^-14 = 6.1e-5), no Newton step.
// Measured over v in [-100, 100] against double (step 5e-5): SiLU within 5.7e-5 relative, SiLU' within
// 1.1e-4 of the size of its terms, r (1 + |v| (1 - r)); both about 18x below u. Against fast_exp (a
// degree-5 polynomial, clamps, the exponent by integer shifts) with a Newton step, this is 15 vector
// operations per 16 weights where that was 30: 4.3 against 6.9 ns per vector in a loop of the forward's
// weights alone on the AMX Xeon (docs/MEASUREMENTS.md, 2026-12-06).
struct Silu {
  V<T> e, r;
  explicit Silu(const V<T>& v) {
    const __m512 t = _mm512_min_ps((__m512)(v * T(-1.44269504088896341)), _mm512_set1_ps(125.0f));
    const V<T> n = (V<T>)_mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V<T> f = (V<T>)t - n;
    V<T> q = T(0.009560519829392433) * f + T(0.05591712146997452);
    q = q * f + T(0.24024981260299683);
    q = q * f + T(0.6931219696998596);
    q = q * f + T(0.9999991655349731);
    e = (V<T>)_mm512_scalef_ps((__m512)q, (__m512)n);
    r = (V<T>)_mm512_rcp14_ps((__m512)(e + T(1)));
  }
  V<T> value(const V<T>& v) const { return v * r; }                 // SiLU(v)
  V<T> grad(const V<T>& v) const { return r * (e * r * v + T(1)); }  // SiLU'(v)
};

// The first n < 16 (or all 16) bf16 of src widened to float32 (zeros past n), and 16 floats rounded to
// bf16 into dst's first n entries.
inline __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
inline V<T> widen16(const bf* src, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, src));
  return (V<T>)_mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void round16(bf* dst, const V<T>& v, __mmask16 m) {
  _mm256_mask_storeu_epi16(dst, m, (__m256i)_mm512_cvtneps_pbh((__m512)v));
}

// n rows of a [T, H, D] bf16 tensor (row stride `stride`) -> dst [rows, ld] bf16: copied, or SiLU'd in
// float32 and rounded when `act`; zero past D and from row n to `rows`.
void pack(const scalar_t* src, int64_t stride, int64_t n, int64_t rows, int64_t D, int64_t ld, bool act, bf* dst) {
  for (int64_t r = 0; r < n; ++r) {
    if (r + PACK_AHEAD < n) __builtin_prefetch(src + (r + PACK_AHEAD) * stride, 0, 3);
    const bf* s = bits(src + r * stride);
    bf* d = dst + r * ld;
    if (act) {  // SiLU as the weights' (Silu), since the result is rounded to bf16 as theirs are
      for (int64_t e = 0; e < D; e += LANES<T>) {
        const __mmask16 m = first(D - e);
        const V<T> x = widen16(s + e, m);
        round16(d + e, Silu(x).value(x), m);
      }
    } else {
      std::memcpy(d, s, D * sizeof(bf));
    }
    std::fill(d + D, d + ld, bf(0));
  }
  std::fill(dst + n * ld, dst + rows * ld, bf(0));
}

// dst [C, ldd] = src [R, lds]^T for bf16 (R, C: multiples of 32; ldd even). Per 32 x 32 block: rows
// 2i and 2i + 1 interleaved into 32-bit words (pair_rows: word (i, c) = (src[2i][c], src[2i + 1][c])),
// which are dst[c][2i], dst[c][2i + 1]: transpose32 moves the words. (Element by element, this was
// about 60% of the one-pass backward's own time in perf, outside the products and vector passes.)
void transpose(const bf* src, int64_t lds, int64_t R, int64_t C, bf* dst, int64_t ldd) {
  alignas(64) bf words[16 * 64];  // [16 row pairs, 32 columns, 2]
  for (int64_t r0 = 0; r0 < R; r0 += 32)
    for (int64_t c0 = 0; c0 < C; c0 += 32) {
      bf16::pair_rows(src + r0 * lds + c0, lds, 32, 32, words);
      bf16::transpose32(words, 64, 16, 32, dst + c0 * ldd + r0, ldd);
    }
}

// rows [BLK, E] = cols [E, BLK]^T for float32 (E a multiple of 16)
void rows_of(const float* cols, int64_t E, float* rows) {
  for (int64_t e = 0; e < E; e += 16)
    for (int64_t c = 0; c < BLK; c += 16) transpose16(cols + e * BLK + c, BLK, rows + c * E + e, E);
}

// One gradient row in bf16: dst[e] = scale * val[e] (times SiLU'(pre[e]) for pre-activations), in float32.
void write_grad_b(scalar_t* dst, const float* val, int64_t n, T scale, const scalar_t* pre) {
  bf* d = reinterpret_cast<bf*>(dst);
  if (pre) {  // SiLU' as the weights' gradients' (Silu): the result is rounded to bf16
    for (int64_t e = 0; e < n; e += LANES<T>) {
      const __mmask16 m = first(n - e);
      const V<T> x = widen16(bits(pre) + e, m);
      round16(d + e, scale * (V<T>)_mm512_maskz_loadu_ps(m, val + e) * Silu(x).grad(x), m);
    }
    return;
  }
  int64_t e = 0;
  for (; e + LANES<T> <= n; e += LANES<T>)  // one pass
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + e), (__m256i)_mm512_cvtneps_pbh((__m512)(vload(val + e) * scale)));
  for (; e < n; ++e) d[e] = bf16::round1(scale * val[e]);
}

// A task's bias-gradient partials: the reversed position table and the bucket columns (as the
// float32 one-pass backward).
struct BiasAcc {
  const Args& a;
  BucketColumns<T> cols;
  T *gposr, *gpos, *gtime;
  void clear() {
    cols.clear();
    std::fill(gposr, gposr + a.P, T(0));
  }
  // row of dL/dscores ds[0, valid) of query i against keys j0 + c
  void add(const T* ds, int64_t i, int64_t j0, int64_t valid, const int64_t* tsk, int64_t tsi, const TimeRuns& runs) {
    const int64_t P = a.P;
    if (a.has_pos) {  // i - j = (i - j0) - c: the first keys may share the last bucket
      const int64_t tail = std::min(valid, std::max<int64_t>(0, i - j0 - (P - 1) + 1));
      cols.add(a.Bt, ds, 0, tail);
      T* __restrict gr = gposr;
      for (int64_t c = tail; c < valid; ++c) gr[P - 1 - (i - j0) + c] += ds[c];
    }
    if (tsk) add_time_grads(ds, tsk, tsi, 0, valid, a.Bt, gtime, runs, cols);
  }
  void flush() {
    if (a.has_pos) {
      for (int64_t d = 0; d < a.P - 1; ++d) gpos[d] += gposr[a.P - 1 - d];
      gpos[a.P - 1] += cols.sum(a.Bt);
    }
    if (a.has_time)
      for (int64_t b = 0; b < a.Bt; ++b) gtime[b] += cols.sum(b);
  }
};

// The pos bias of score-tile rows, as vectors: pos(i - j) from a table read contiguously along the row
// (the time term: Row). The pointwise work of a tile then goes in one pass per row (scale, bias, SiLU,
// mask, rounding), where the float32 kernels' steps (alpha, add_pos, the time runs, SiLU, fills,
// rounding) each read and wrote the row (with thread_scratch, the gain in docs/MEASUREMENTS.md,
// 2026-12-05).
struct RowBias {
  // ext [H, P + 2 BLK]: ext[h][u] = pos[h][min(P + BLK - 1 - u, P - 1)] for u < P + BLK, 0 after; the
  // row of query i against keys j0 + x reads pos(i - j0 - x) = ext[P + BLK - 1 - (i - j0) + x]
  std::vector<T> ext;
  int64_t P, W;
  RowBias(const Pass<scalar_t>& p, const Args& a) : ext(a.H * (a.P + 2 * BLK), T(0)), P(a.P), W(a.P + 2 * BLK) {
    for (int64_t h = 0; h < a.H; ++h)
      for (int64_t u = 0; u < P + BLK; ++u) ext[h * W + u] = p.pos[h * P + std::min(P + BLK - 1 - u, P - 1)];
  }
  // the pos terms of the row at distance d0 = i - j0 (nullptr: every entry is the last bucket's, far)
  const T* pos_row(int64_t h, int64_t d0) const {
    return d0 <= P + BLK - 1 ? ext.data() + h * W + P + BLK - 1 - d0 : nullptr;
  }
  // BLK entries of the last bucket's term (the far rows' constant, as a row)
  const T* far_row(int64_t h) const { return ext.data() + h * W; }
};

// tb[x] = the time term of entries x < valid of a row (keys tsk[x], query time tsi), with the runs for
// the gradients (runs.n = -1 for unsorted timestamps: entry by entry).
inline void time_row(const Bias<T>& b, const int64_t* tsk, int64_t tsi, int64_t valid, T* tb, TimeRuns& runs) {
  if (b.sorted) {
    time_runs(tsk, tsi, 0, valid, b.Bt, runs);
    for (int64_t k = 0; k < runs.n; ++k) {
      const V<T> val = V<T>{} + b.time[runs.run[k].b];
      for_vectors<T>(runs.run[k].x0, runs.run[k].x1, [&](int64_t c, const auto& in) {
        vstore(tb + c, in ? val : vload(tb + c));
      });
    }
  } else {
    runs.n = -1;
    for (int64_t x = 0; x < valid; ++x) tb[x] = b.time[time_bucket(tsk[x] - tsi, b.Bt)];
  }
}

// 16 floats -> 16 bf16 (round to nearest even)
inline void store_bf16(bf* dst, const V<T>& v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh((__m512)v));
}

// A head's time table in two vectors, for the time term computed lane by lane in the vector pass
// (Bt <= 32): the bucket of 1 + |ts_i - ts_k| by the exponent of its (exact) double, time_bucket's
// arithmetic, so the same buckets bit for bit, then a two-register table lookup. time_row's runs
// (their search branches row by row) are left to the passes that need them for the gradients.
struct TimeLanes {
  bool on = false;
  __m512 lo, hi;
  __m512d cap;
  explicit TimeLanes(const Bias<T>& b) {
    if (!b.ts || b.Bt > 32) return;
    alignas(64) float t[32] = {};
    std::copy(b.time, b.time + b.Bt, t);
    lo = _mm512_load_ps(t);
    hi = _mm512_load_ps(t + 16);
    cap = _mm512_set1_pd(static_cast<double>(b.Bt - 1));
    on = true;
  }
  // the buckets (int32) of keys tsk[0, 16) against the query time tsi; keys from n on are not read (zero)
  __m512i buckets(const int64_t* tsk, int64_t tsi, int64_t n) const {
    const __m512i ti = _mm512_set1_epi64(tsi), one = _mm512_set1_epi64(1);
    const auto bucket = [&](int64_t k, const int64_t* p) {  // 8 keys' buckets, int32
      const __mmask8 m = k >= 8 ? 0xff : k <= 0 ? 0 : static_cast<__mmask8>((1u << k) - 1);
      const __m512i d = _mm512_add_epi64(_mm512_abs_epi64(_mm512_sub_epi64(ti, _mm512_maskz_loadu_epi64(m, p))), one);
      return _mm512_cvttpd_epi32(_mm512_min_pd(_mm512_getexp_pd(_mm512_cvtepi64_pd(d)), cap));
    };
    return _mm512_inserti64x4(_mm512_castsi256_si512(bucket(n, tsk)), bucket(n - 8, tsk + 8), 1);
  }
  // their time terms
  V<T> at(const int64_t* tsk, int64_t tsi, int64_t n) const {
    return (V<T>)_mm512_permutex2var_ps(lo, buckets(tsk, tsi, n), hi);
  }
  // time_runs' runs of keys [0, valid) (sorted timestamps), found 16 keys at a time: a run starts where a
  // lane's bucket differs from the lane before it (the starts compressed out of the lanes), where
  // time_runs computed every bucket and compacted the starts entry by entry (4.6% of the one-pass
  // backward's samples at 8 x 1,024 with the rows of many runs, 2026-12-06)
  void runs(const int64_t* tsk, int64_t tsi, int64_t valid, TimeRuns& out) const {
    alignas(64) int32_t start[BLK + 16], bucket[BLK + 16];
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i before = _mm512_set1_epi32(-1);  // no bucket is -1: the first key starts a run
    int64_t n = 0;
    for (int64_t c = 0; c < valid; c += 16) {
      const __m512i b = buckets(tsk + c, tsi, valid - c);
      const __m512i prev = _mm512_alignr_epi32(b, before, 15);  // lane x: the bucket of key c + x - 1
      const __mmask16 m = _mm512_cmpneq_epi32_mask(b, prev) & first_lanes(valid - c);
      _mm512_mask_compressstoreu_epi32(start + n, m, _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(c))));
      _mm512_mask_compressstoreu_epi32(bucket + n, m, b);
      n += __builtin_popcount(m);
      before = b;
    }
    start[n] = static_cast<int32_t>(valid);
    for (int64_t r = 0; r < n; ++r) out.run[r] = {start[r], start[r + 1], bucket[r]};
    out.n = n;
  }
  static __mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
};

// alpha s + b in one rounding (an explicit FMA, so that every pass computes a score's pre-activation
// to the same bits, whatever the compiler contracts)
inline V<T> scaled(T alpha, const V<T>& s, const V<T>& b) {
  return (V<T>)_mm512_fmadd_ps(_mm512_set1_ps(alpha), (__m512)s, (__m512)b);
}

// One score-tile row's bias and its causal keys: what the weights of its entries need (the forward
// and both backwards share it). pre(c) = alpha s + pos + time for the 16 entries at column c; in(c)
// marks the keys c < valid (at or before the query).
struct Row {
  const Pass<scalar_t>& p;
  const T* s;   // the score row (float32)
  const T* pr;  // RowBias::pos_row (nullptr: every entry far)
  T far;
  // The time term, the first that applies: one bucket over the row (sorted timestamps whose first and
  // last keys share it: most rows, away from the diagonal), added as a constant; else computed lane
  // by lane (TimeLanes); else (need_runs, or over 32 buckets) time_row's buffer and runs. Before, every
  // row took time_row's runs: on the AMX Xeon the forward at 8 x 1,024 tokens (2 heads, one thread)
  // ran 19.4-20.3 ms with both biases against 12.6 with the pos bias alone; with the constant rows
  // 14.6-17.3 (docs/MEASUREMENTS.md, 2026-12-06).
  T tconst;                // the one bucket's term (0: no time bias)
  const TimeLanes* lanes;  // nullptr: not by lanes
  const T* tb;             // nullptr: not time_row's buffer
  const int64_t* tsk;      // the keys' timestamps, and the query's
  int64_t tsi, valid;
  TimeRuns runs;  // the runs of buckets along the row where need_runs (the bias gradients use them)
  // (inlined: the passes call it twice a row pair, and need_runs is constant at each call)
  __attribute__((always_inline)) Row(const Pass<scalar_t>& p_, const Bias<T>& bias, const RowBias& rb, int64_t h,
                                     const T* s_, int64_t i, int64_t j0, int64_t nk, T* tb_buf, const TimeLanes& tl,
                                     bool need_runs)
      : p(p_), s(s_), pr(rb.pos_row(h, i - j0)), far(bias.pos[bias.P - 1]), tconst(0), lanes(nullptr), tb(nullptr),
        tsk(bias.ts ? bias.ts + j0 : nullptr), tsi(bias.ts ? bias.ts[i] : 0), valid(std::min(nk, i - j0 + 1)) {
    if (!bias.ts || valid <= 0) return;
    int64_t first = 0, last = 0;
    if (bias.sorted) {
      first = time_bucket_one(tsk[0] - tsi, bias.Bt);
      last = time_bucket_one(tsk[valid - 1] - tsi, bias.Bt);
      if (first == last) {
        tconst = bias.time[first];
        runs.n = 1;
        runs.run[0] = {0, valid, first};
        return;
      }
    }
    if (tl.on && (!need_runs || (bias.sorted && first - last != 1 && last - first != 1))) {
      // more than two runs (near the diagonal) where the gradients need them: found lane by lane, and the
      // terms too, where time_row found the runs entry by entry and added the terms a pass a run
      // (time_row: 5.5% of the one-pass backward's samples at 8 x 1,024, 2026-12-06)
      if (need_runs) tl.runs(tsk, tsi, valid, runs);
      lanes = &tl;
      return;
    }
    time_row(bias, tsk, tsi, valid, tb_buf, runs);  // two runs (a bisection), or unsorted, or over 32 buckets
    tb = tb_buf;
  }
  V<T> pre(int64_t c) const {
    const V<T> v = scaled(p.alpha, vload(s + c), pr ? vload(pr + c) : V<T>{} + far);
    if (tb) return v + vload(tb + c);
    return lanes ? v + lanes->at(tsk + c, tsi, valid - c) : v + tconst;
  }
  auto in(int64_t c) const {
    static_assert(LANES<T> == 16, "the avx512 path: 16 float lanes");
    const IVec<T>::type lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    return (lane + static_cast<int32_t>(c)) < static_cast<int32_t>(valid);
  }
};

// A row whose every key through Kk is at or before the query and whose time term is one constant
// (most rows away from the diagonal): pre(c) = (alpha s + b[c]) + k, Row::pre's arithmetic (the same
// bits) without its branches and masks.
struct Plain {
  const T *s, *b;
  T k;
  static bool of(const Row& row, int64_t Kk, const RowBias& rb, int64_t h, Plain& out) {
    if (row.tb || row.lanes || row.valid < Kk) return false;
    out = {row.s, row.pr ? row.pr : rb.far_row(h), row.tconst};
    return true;
  }
  V<T> pre(T alpha, int64_t c) const { return scaled(alpha, vload(s + c), vload(b + c)) + k; }
};

// The weights of a score tile S [query r, key c] (float32, row stride BLK), rounded to bf16 into W [Mq,
// ldw]: SiLU(alpha s + bias) / n for c < valid(r), zero past it through Kk columns and in rows nq .. Mq.
void weights(const T* S, bf* W, int64_t ldw, int64_t i0, int64_t j0, int64_t nq, int64_t nk, int64_t Mq, int64_t Kk,
             const Pass<scalar_t>& p, const Bias<T>& bias, const RowBias& rb, int64_t h) {
  alignas(64) T tb[BLK] = {};
  const TimeLanes tl(bias);
  for (int64_t r = 0; r < nq; ++r) {
    const Row row(p, bias, rb, h, S + r * BLK, i0 + r, j0, nk, tb, tl, false);
    bf* w = W + r * ldw;
    if (row.valid >= Kk) {  // every key of the row is at or before the query (off the diagonal): no mask
      for (int64_t c = 0; c < Kk; c += LANES<T>) {
        const V<T> v = row.pre(c);
        store_bf16(w + c, Silu(v).value(v) * p.inv_n);
      }
    } else {
      for (int64_t c = 0; c < Kk; c += LANES<T>) {
        const V<T> v = row.pre(c);
        store_bf16(w + c, row.in(c) ? Silu(v).value(v) * p.inv_n : V<T>{});
      }
    }
  }
  for (int64_t r = nq; r < Mq; ++r) std::fill(W + r * ldw, W + r * ldw + Kk, bf(0));
}

// 16 columns of two rows as VNNI pairs: dst[2 x + t] = bf16(row t's entry x) (round to nearest even)
inline void store_pair(bf* dst, const V<T>& r0, const V<T>& r1, const __m512i& mix) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)r1, (__m512)r0);  // r0 low, r1 high
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi16(mix, both));
}

// Where tile_backward writes (a null pointer: not wanted).
struct TileOut {
  bf* dSb = nullptr;  // dS rows [Mq, ld] bf16 (A of dQ += dS K), zero past valid through Kk, rows nq .. Mq zero
  int64_t ld = 0;
  bf* Wp = nullptr;   // the weights in pairs of query rows [Kq / 2, Nk, 2] (B of dV^T += dO^T W), rows past nq zero
  bf* dSp = nullptr;  // dS in pairs of query rows, the same layout (B of dK^T += Q^T dS)
  int64_t Nk = 0;
  BiasAcc* acc = nullptr;  // the bias gradients' partials (they read dS's float32 rows from dW)
};

// The backward of a score tile S [query, key] (the scores, float32) with dW (dL/dweights, float32):
// per row, the weights and dL/dscores dS = dW SiLU'(pre) / n (zero for c >= valid(r)), written as
// `out` asks (the template flags: ACC, DSB, PAIRS for out.acc, out.dSb, out.Wp). Two rows at a time,
// in one vector pass (Row): the pairs come straight from the vectors; two Plain rows (most of them)
// without the masks and Row::pre's branches. dS's float32 rows are written back into dW only for the
// bias partials.
template <bool ACC, bool DSB, bool PAIRS>
void tile_backward_t(const T* S, T* dW, int64_t i0, int64_t j0, int64_t nq, int64_t nk, int64_t Mq, int64_t Kk,
                     const Pass<scalar_t>& p, const Bias<T>& bias, const RowBias& rb, int64_t h, const TileOut& out) {
  alignas(64) static const uint16_t mixing[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                                  8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i mix = _mm512_load_si512(mixing);
  const int64_t rows = PAIRS ? round_up(nq, 32) : round_up(nq, 2);  // pairs: zero rows through Kq
  alignas(64) T tb[2][BLK] = {};
  const TimeLanes tl(bias);
  for (int64_t r = 0; r < rows; r += 2) {
    if (r >= nq) {  // past the tile's queries: zero pairs
      if constexpr (PAIRS) {
        std::fill(out.Wp + r * out.Nk, out.Wp + (r + 2) * out.Nk, bf(0));
        std::fill(out.dSp + r * out.Nk, out.dSp + (r + 2) * out.Nk, bf(0));
      }
      continue;
    }
    const bool two = r + 1 < nq;
    const Row a(p, bias, rb, h, S + r * BLK, i0 + r, j0, nk, tb[0], tl, ACC);
    const Row b(p, bias, rb, h, S + (r + 1) * BLK, two ? i0 + r + 1 : i0 + r, j0, nk, tb[1], tl, ACC);
    T* __restrict da = dW + r * BLK;
    T* __restrict db = dW + (r + 1) * BLK;
    const auto emit = [&](int64_t c, const V<T>* w, const V<T>* g) {
      if constexpr (ACC) {
        vstore(da + c, g[0]);
        if (two) vstore(db + c, g[1]);
      }
      if constexpr (DSB) {
        store_bf16(out.dSb + r * out.ld + c, g[0]);
        if (two) store_bf16(out.dSb + (r + 1) * out.ld + c, g[1]);
      }
      if constexpr (PAIRS) {
        if (c < out.Nk) {
          store_pair(out.Wp + r * out.Nk + 2 * c, w[0], w[1], mix);
          store_pair(out.dSp + r * out.Nk + 2 * c, g[0], g[1], mix);
        }
      }
    };
    Plain x, y;
    if (two && Plain::of(a, Kk, rb, h, x) && Plain::of(b, Kk, rb, h, y)) {
      for (int64_t c = 0; c < Kk; c += LANES<T>) {
        const V<T> u = x.pre(p.alpha, c), v = y.pre(p.alpha, c);
        const Silu su(u), sv(v);
        const V<T> w[2] = {su.value(u) * p.inv_n, sv.value(v) * p.inv_n};
        const V<T> g[2] = {vload(da + c) * su.grad(u) * p.inv_n, vload(db + c) * sv.grad(v) * p.inv_n};
        emit(c, w, g);
      }
    } else {
      for (int64_t c = 0; c < Kk; c += LANES<T>) {
        V<T> w[2], g[2];
        const Row* row[2] = {&a, &b};
        const T* d[2] = {da, db};
        for (int t = 0; t < 2; ++t) {
          if (t == 1 && !two) {
            w[1] = g[1] = V<T>{};
            break;
          }
          const V<T> v = row[t]->pre(c);
          const Silu sg(v);
          const auto in = row[t]->in(c);
          w[t] = in ? sg.value(v) * p.inv_n : V<T>{};
          g[t] = in ? vload(d[t] + c) * sg.grad(v) * p.inv_n : V<T>{};
        }
        emit(c, w, g);
      }
    }
    if constexpr (ACC) {
      out.acc->add(da, i0 + r, j0, a.valid, a.tsk, a.tsi, a.runs);
      if (two) out.acc->add(db, i0 + r + 1, j0, b.valid, b.tsk, b.tsi, b.runs);
    }
  }
  if constexpr (DSB)
    for (int64_t r = nq; r < Mq; ++r) std::fill(out.dSb + r * out.ld, out.dSb + r * out.ld + Kk, bf(0));
}

// tile_backward_t for the outputs the passes ask for: every one (the one-pass backward), dS rows and
// the bias partials (the dq pass), the pairs (the dk/dv pass).
void tile_backward(const T* S, T* dW, int64_t i0, int64_t j0, int64_t nq, int64_t nk, int64_t Mq, int64_t Kk,
                   const Pass<scalar_t>& p, const Bias<T>& bias, const RowBias& rb, int64_t h, const TileOut& out) {
  const bool acc = out.acc != nullptr, dsb = out.dSb != nullptr, pairs = out.Wp != nullptr;
  if (acc && dsb && pairs)
    tile_backward_t<true, true, true>(S, dW, i0, j0, nq, nk, Mq, Kk, p, bias, rb, h, out);
  else if (acc && dsb && !pairs)
    tile_backward_t<true, true, false>(S, dW, i0, j0, nq, nk, Mq, Kk, p, bias, rb, h, out);
  else if (!acc && !dsb && pairs)
    tile_backward_t<false, false, true>(S, dW, i0, j0, nq, nk, Mq, Kk, p, bias, rb, h, out);
  else
    TORCH_CHECK(false, "tile_backward: no pass asks for these outputs (acc ", acc, ", dS rows ", dsb, ", pairs ",
                pairs, ")");
}

struct Sizes {
  int64_t D, Dv, Dk, Dvk, X;  // X: the longer of Dk, Dvk (row buffers)
  explicit Sizes(const Args& a)
      : D(a.D), Dv(a.Dv), Dk(round_up(a.D, 32)), Dvk(round_up(a.Dv, 32)), X(std::max({Dk, Dvk, BLK})) {}
};

// A key tile's operands: KT (pairs of features, B of Q K^T), KP (rows in pairs, B of dS K), VT (B of
// dO V^T); Kb, Vb the packed rows.
struct KeyTile {
  bf *Kb, *Vb, *KT, *KP, *VT;
  void pack(const Args& a, const Sizes& z, int64_t row0, int64_t h, int64_t nk) {
    hstu::pack(a.k.data_ptr<scalar_t>() + row0 * a.rk + h * z.D, a.rk, nk, BLK, z.D, z.Dk, a.act, Kb);
    hstu::pack(a.v.data_ptr<scalar_t>() + row0 * a.rv + h * z.Dv, a.rv, nk, BLK, z.Dv, z.Dvk, a.act, Vb);
    bf16::transpose32(Kb, z.Dk, BLK, z.Dk / 2, KT, 2 * BLK);
    if (KP) bf16::pair_rows(Kb, z.Dk, BLK, z.Dk, KP);
    bf16::transpose32(Vb, z.Dvk, BLK, z.Dvk / 2, VT, 2 * BLK);
  }
};

// ---- forward -----------------------------------------------------------------------------------

at::Tensor forward_impl(const Args& a, double alpha_in) {
  const Pass<scalar_t> p(a, alpha_in);
  const RowBias rb(p, a);
  const Sizes z(a);
  const Gemm gemm{::grlib::isa::units() == ::grlib::isa::AMX};
  auto out = at::empty({a.T, a.H, a.Dv}, a.q.options());
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
  scalar_t* y = out.data_ptr<scalar_t>();
  const ForwardTasks ft = forward_tasks(p.o, a.B, a.H);
  const std::vector<Task>& tasks = ft.tasks;
  const int64_t workers = p.workers(tasks.size()), Lp = round_up(longest_sequence(p.o, a.B), BLK);
  const int64_t per = Carve::floats({BLK * BLK, BLK * z.Dvk},
                                    {Lp * z.Dk, Lp * z.Dk, Lp * z.Dvk, Lp * z.Dvk, BLK * z.Dk, BLK * Lp});
  run_tasks(tasks, workers, [&](int64_t, const Task& t) {
    Carve cv{thread_scratch<float>(per)};
    T *S = cv.f32(BLK * BLK), *O = cv.f32(BLK * z.Dvk);
    // KT [Lp / BLK, Dk / 2, BLK, 2]: each key tile's features in pairs; W [Lp / BLK, BLK, BLK]: a query
    // tile's weights of every key, by key tile (blocks of 64 columns: Gemm::blocked)
    bf *Kb = cv.b16(Lp * z.Dk), *KT = cv.b16(Lp * z.Dk), *Vb = cv.b16(Lp * z.Dvk), *VP = cv.b16(Lp * z.Dvk);
    bf *Qb = cv.b16(BLK * z.Dk), *W = cv.b16(BLK * Lp);
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base;
    const int64_t tile0 = ft.tile0(t), tile1 = ft.tile1(t, L);
    const int64_t keys = std::min(L, tile1 * BLK), Kr = round_up(keys, BLK);
    const Bias<T> bias = p.bias(t.b, t.h);
    gemm.begin();
    pack(k + base * a.rk + t.h * z.D, a.rk, keys, Kr, z.D, z.Dk, a.act, Kb);
    for (int64_t j0 = 0; j0 < Kr; j0 += BLK)
      bf16::transpose32(Kb + j0 * z.Dk, z.Dk, BLK, z.Dk / 2, KT + j0 * z.Dk, 2 * BLK);
    pack(v + base * a.rv + t.h * z.Dv, a.rv, keys, Kr, z.Dv, z.Dvk, a.act, Vb);
    bf16::pair_rows(Vb, z.Dvk, Kr, z.Dvk, VP);  // VP [Kr / 2, Dvk, 2]
    for (int64_t i0 = tile0 * BLK; i0 < tile1 * BLK; i0 += BLK) {
      const int64_t nq = std::min(BLK, L - i0), Mq = round_up(nq, 16);
      pack(q + (base + i0) * a.rq + t.h * z.D, a.rq, nq, Mq, z.D, z.Dk, a.act, Qb);
      for (int64_t j0 = 0; j0 < i0 + nq; j0 += BLK) {
        const int64_t nk = std::min(BLK, i0 + nq - j0), Nk = round_up(nk, 16), Kk = round_up(nk, 32);
        gemm(Mq, Nk, z.Dk, Qb, z.Dk, KT + j0 * z.Dk, 2 * BLK, S, BLK, false);  // S [query, key] = q . k
        weights(S, W + j0 * BLK, BLK, i0, j0, nq, nk, Mq, Kk, p, bias, rb, t.h);
      }
      // O = W V over every key at once: one float32 accumulator pass (a product per key tile
      // loaded and stored O's tiles each time)
      gemm.blocked(Mq, z.Dvk, round_up(i0 + nq, 32), W, BLK, BLK * BLK, VP, 2 * z.Dvk, O, z.Dvk, false);
      for (int64_t r = 0; r < nq; ++r)
        bf16::round_row(O + r * z.Dvk, reinterpret_cast<bf*>(y + (base + i0 + r) * p.hsv + t.h * z.Dv), z.Dv);
    }
    gemm.end();
  });
  return out;
}

// ---- backward ----------------------------------------------------------------------------------

// Writes a key tile's dK (from dK^T, times alpha) and dV (from dV^T) rows.
struct KeyGrads {
  T *dKT, *dVT, *rows;
  void clear(const Sizes& z) {
    std::fill(dKT, dKT + z.Dk * BLK, T(0));
    std::fill(dVT, dVT + z.Dvk * BLK, T(0));
  }
  void write(const Args& a, const Sizes& z, const Pass<scalar_t>& p, int64_t row0, int64_t h, int64_t nk,
             at::Tensor& dk, at::Tensor& dv) {
    const scalar_t *k = a.k.data_ptr<scalar_t>(), *v = a.v.data_ptr<scalar_t>();
    scalar_t *gk = dk.data_ptr<scalar_t>(), *gv = dv.data_ptr<scalar_t>();
    const int64_t ok = dk.stride(0), ov = dv.stride(0);
    rows_of(dKT, z.Dk, rows);
    for (int64_t c = 0; c < nk; ++c)
      write_grad_b(gk + (row0 + c) * ok + h * z.D, rows + c * z.Dk, z.D, p.alpha,
                   a.act ? k + (row0 + c) * a.rk + h * z.D : nullptr);
    rows_of(dVT, z.Dvk, rows);
    for (int64_t c = 0; c < nk; ++c)
      write_grad_b(gv + (row0 + c) * ov + h * z.Dv, rows + c * z.Dvk, z.Dv, T(1),
                   a.act ? v + (row0 + c) * a.rv + h * z.Dv : nullptr);
  }
};

void write_dq(const Args& a, const Sizes& z, const Pass<scalar_t>& p, const T* dQ, int64_t row0, int64_t h,
              int64_t n, at::Tensor& dq) {
  const scalar_t* q = a.q.data_ptr<scalar_t>();
  scalar_t* gq = dq.data_ptr<scalar_t>();
  for (int64_t r = 0; r < n; ++r)
    write_grad_b(gq + (row0 + r) * dq.stride(0) + h * z.D, dQ + r * z.Dk, z.D, p.alpha,
                 a.act ? q + (row0 + r) * a.rq + h * z.D : nullptr);
}

// One pass per (sequence, head) (the float32 backward_single's order of tiles).
void backward_single(const Args& a, double alpha_in, const at::Tensor& grad, at::Tensor& dq, at::Tensor& dk,
                     at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime, const Gemm& gemm) {
  const Pass<scalar_t> p(a, alpha_in);
  const RowBias rb(p, a);
  const Sizes z(a);
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *g = grad.data_ptr<scalar_t>();
  const int64_t rg = grad.stride(0);
  const std::vector<Task> tasks = sequence_tasks(p.o, a.B, a.H);
  const int64_t workers = p.workers(tasks.size()), Lp = round_up(longest_sequence(p.o, a.B), BLK);
  // per worker, float32: dQ [Lp, Dk], the key tile's gradients (KeyGrads), S, dW; the bias partials
  // bf16: Q, Q^T, dO, dO^T of the sequence; KP [Lp / 2, Dk, 2] (every key's rows in pairs); dS
  // [Lp, Lp] (every tile pair's dS, for dQ after the key tiles); W and dS of a key tile against every
  // query after it, in pairs of query rows [Lp / 2, BLK, 2]; the key tile (KeyTile)
  const int64_t per = Carve::floats(
      {Lp * z.Dk, z.Dk * BLK, z.Dvk * BLK, BLK * z.X, BLK * BLK, BLK * BLK, (a.Bt + 1) * BLK, a.P},
      {Lp * z.Dk, z.Dk * Lp, Lp * z.Dvk, z.Dvk * Lp, Lp * z.Dk, Lp * Lp, Lp * BLK, Lp * BLK, BLK * z.Dk,
       BLK * z.Dvk, BLK * z.Dk, BLK * z.Dvk});
  BiasGrads<T> bias_grads(tasks.size(), a.P, a.Bt);
  run_tasks(tasks, workers, [&](int64_t, const Task& t) {
    Carve cv{thread_scratch<float>(per)};
    T* dQ = cv.f32(Lp * z.Dk);
    KeyGrads kg{cv.f32(z.Dk * BLK), cv.f32(z.Dvk * BLK), cv.f32(BLK * z.X)};
    T *S = cv.f32(BLK * BLK), *dW = cv.f32(BLK * BLK);
    const int64_t task = &t - tasks.data();
    BiasAcc acc{a, {cv.f32((a.Bt + 1) * BLK), a.Bt + 1}, cv.f32(a.P), bias_grads.pos(task), bias_grads.time(task)};
    // Q^T [Lp / BLK, Dk, BLK] and dO^T by query tile; dS [Lp / BLK, Lp, BLK] by key tile (blocks of 64
    // columns: Gemm::blocked)
    bf *Qb = cv.b16(Lp * z.Dk), *QT = cv.b16(z.Dk * Lp), *dOb = cv.b16(Lp * z.Dvk), *dOT = cv.b16(z.Dvk * Lp);
    bf *KP = cv.b16(Lp * z.Dk), *dS = cv.b16(Lp * Lp), *Wp = cv.b16(Lp * BLK), *dSp = cv.b16(Lp * BLK);
    KeyTile kt{cv.b16(BLK * z.Dk), cv.b16(BLK * z.Dvk), cv.b16(BLK * z.Dk), nullptr, cv.b16(BLK * z.Dvk)};
    acc.clear();
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base, Lr = round_up(L, BLK);
    const Bias<T> bias = p.bias(t.b, t.h);
    gemm.begin();
    pack(q + base * a.rq + t.h * z.D, a.rq, L, Lr, z.D, z.Dk, a.act, Qb);
    pack(g + base * rg + t.h * z.Dv, rg, L, Lr, z.Dv, z.Dvk, false, dOb);
    for (int64_t i0 = 0; i0 < Lr; i0 += BLK) {
      transpose(Qb + i0 * z.Dk, z.Dk, BLK, z.Dk, QT + i0 * z.Dk, BLK);
      transpose(dOb + i0 * z.Dvk, z.Dvk, BLK, z.Dvk, dOT + i0 * z.Dvk, BLK);
    }
    for (int64_t j0 = 0; j0 < L; j0 += BLK) {
      const int64_t nk = std::min(BLK, L - j0), Nk = round_up(nk, 16), Kk = round_up(nk, 32);
      kt.KP = KP + j0 * z.Dk;  // key rows j0 .. j0 + BLK in pairs
      kt.pack(a, z, base + j0, t.h, nk);
      for (int64_t i0 = j0; i0 < L; i0 += BLK) {
        const int64_t nq = std::min(BLK, L - i0), Mq = round_up(nq, 16);
        gemm(Mq, Nk, z.Dk, Qb + i0 * z.Dk, z.Dk, kt.KT, 2 * BLK, S, BLK, false);     // S = q . k
        gemm(Mq, Nk, z.Dvk, dOb + i0 * z.Dvk, z.Dvk, kt.VT, 2 * BLK, dW, BLK, false);  // dW = dO V^T
        TileOut o{dS + j0 * Lp + i0 * BLK, BLK, Wp + (i0 - j0) * Nk, dSp + (i0 - j0) * Nk, Nk, &acc};
        tile_backward(S, dW, i0, j0, nq, nk, Mq, Kk, p, bias, rb, t.h, o);
      }
      // over every query at or after the key tile at once (K = the queries): dV_j^T = dO^T W, dK_j^T = Q^T dS
      const int64_t Kt = round_up(L - j0, 32);
      gemm.blocked(z.Dvk, Nk, Kt, dOT + j0 * z.Dvk, BLK, z.Dvk * BLK, Wp, 2 * Nk, kg.dVT, BLK, false);
      gemm.blocked(z.Dk, Nk, Kt, QT + j0 * z.Dk, BLK, z.Dk * BLK, dSp, 2 * Nk, kg.dKT, BLK, false);
      kg.write(a, z, p, base + j0, t.h, nk, dk, dv);
    }
    for (int64_t i0 = 0; i0 < L; i0 += BLK) {  // dQ_i = dS_i K over every key at or before the tile at once
      const int64_t nq = std::min(BLK, L - i0);
      gemm.blocked(round_up(nq, 16), z.Dk, round_up(i0 + nq, 32), dS + i0 * BLK, BLK, Lp * BLK, KP, 2 * z.Dk,
                   dQ + i0 * z.Dk, z.Dk, false);
    }
    write_dq(a, z, p, dQ, base, t.h, L, dq);
    acc.flush();
    gemm.end();
  });
  bias_grads.reduce(tasks, a, dpos, dtime);
}

// dq and the bias gradients: one task per (sequence, head, query tile).
void backward_dq(const Args& a, double alpha_in, const at::Tensor& grad, at::Tensor& dq, at::Tensor& dpos,
                 at::Tensor& dtime, const Gemm& gemm) {
  const Pass<scalar_t> p(a, alpha_in);
  const RowBias rb(p, a);
  const Sizes z(a);
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *g = grad.data_ptr<scalar_t>();
  const int64_t rg = grad.stride(0);
  const auto tasks = make_tasks(p.o, a.B, a.H, /*by_key=*/false);
  const int64_t workers = p.workers(tasks.size());
  const int64_t per = Carve::floats({BLK * z.Dk, BLK * BLK, BLK * BLK, (a.Bt + 1) * BLK, a.P},
                                    {BLK * z.Dk, BLK * z.Dvk, BLK * z.Dk, BLK * z.Dvk, BLK * z.Dk, BLK * z.Dk,
                                     BLK * z.Dvk, BLK * BLK});
  BiasGrads<T> bias_grads(tasks.size(), a.P, a.Bt);
  run_tasks(tasks, workers, [&](int64_t, const Task& t) {
    Carve cv{thread_scratch<float>(per)};
    T *dQ = cv.f32(BLK * z.Dk), *S = cv.f32(BLK * BLK), *dW = cv.f32(BLK * BLK);
    const int64_t task = &t - tasks.data();
    BiasAcc acc{a, {cv.f32((a.Bt + 1) * BLK), a.Bt + 1}, cv.f32(a.P), bias_grads.pos(task), bias_grads.time(task)};
    bf *Qb = cv.b16(BLK * z.Dk), *dOb = cv.b16(BLK * z.Dvk);
    KeyTile kt{cv.b16(BLK * z.Dk), cv.b16(BLK * z.Dvk), cv.b16(BLK * z.Dk), cv.b16(BLK * z.Dk), cv.b16(BLK * z.Dvk)};
    bf* dSb = cv.b16(BLK * BLK);
    acc.clear();
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base, i0 = t.blk * BLK, nq = std::min(BLK, L - i0);
    const int64_t Mq = round_up(nq, 16);
    const Bias<T> bias = p.bias(t.b, t.h);
    gemm.begin();
    pack(q + (base + i0) * a.rq + t.h * z.D, a.rq, nq, Mq, z.D, z.Dk, a.act, Qb);
    pack(g + (base + i0) * rg + t.h * z.Dv, rg, nq, Mq, z.Dv, z.Dvk, false, dOb);
    std::fill(dQ, dQ + Mq * z.Dk, T(0));
    for (int64_t j0 = 0; j0 < i0 + nq; j0 += BLK) {
      const int64_t nk = std::min(BLK, i0 + nq - j0), Nk = round_up(nk, 16), Kk = round_up(nk, 32);
      kt.pack(a, z, base + j0, t.h, nk);
      gemm(Mq, Nk, z.Dk, Qb, z.Dk, kt.KT, 2 * BLK, S, BLK, false);
      gemm(Mq, Nk, z.Dvk, dOb, z.Dvk, kt.VT, 2 * BLK, dW, BLK, false);
      TileOut o;
      o.dSb = dSb, o.ld = BLK, o.acc = &acc;
      tile_backward(S, dW, i0, j0, nq, nk, Mq, Kk, p, bias, rb, t.h, o);
      gemm(Mq, z.Dk, Kk, dSb, BLK, kt.KP, 2 * z.Dk, dQ, z.Dk, true);  // dQ += dS K_j
    }
    write_dq(a, z, p, dQ, base + i0, t.h, nq, dq);
    acc.flush();
    gemm.end();
  });
  bias_grads.reduce(tasks, a, dpos, dtime);
}

// dk and dv: one task per (sequence, head, key tile), walking the query tiles at or after it.
void backward_dkv(const Args& a, double alpha_in, const at::Tensor& grad, at::Tensor& dk, at::Tensor& dv,
                  const Gemm& gemm) {
  const Pass<scalar_t> p(a, alpha_in);
  const RowBias rb(p, a);
  const Sizes z(a);
  const scalar_t *q = a.q.data_ptr<scalar_t>(), *g = grad.data_ptr<scalar_t>();
  const int64_t rg = grad.stride(0);
  const auto tasks = make_tasks(p.o, a.B, a.H, /*by_key=*/true);
  const int64_t workers = p.workers(tasks.size());
  const int64_t per = Carve::floats({z.Dk * BLK, z.Dvk * BLK, BLK * z.X, BLK * BLK, BLK * BLK},
                                    {BLK * z.Dk, z.Dk * BLK, BLK * z.Dvk, z.Dvk * BLK, BLK * z.Dk, BLK * z.Dvk,
                                     BLK * z.Dk, BLK * z.Dvk, BLK * BLK, BLK * BLK});
  run_tasks(tasks, workers, [&](int64_t, const Task& t) {
    Carve cv{thread_scratch<float>(per)};
    KeyGrads kg{cv.f32(z.Dk * BLK), cv.f32(z.Dvk * BLK), cv.f32(BLK * z.X)};
    T *S = cv.f32(BLK * BLK), *dW = cv.f32(BLK * BLK);
    bf *Qb = cv.b16(BLK * z.Dk), *QT = cv.b16(z.Dk * BLK), *dOb = cv.b16(BLK * z.Dvk), *dOT = cv.b16(z.Dvk * BLK);
    KeyTile kt{cv.b16(BLK * z.Dk), cv.b16(BLK * z.Dvk), cv.b16(BLK * z.Dk), nullptr, cv.b16(BLK * z.Dvk)};
    bf *Wp = cv.b16(BLK * BLK), *dSp = cv.b16(BLK * BLK);
    const int64_t base = p.o[t.b], L = p.o[t.b + 1] - base, j0 = t.blk * BLK, nk = std::min(BLK, L - j0);
    const int64_t Nk = round_up(nk, 16), Kk = round_up(nk, 32);
    const Bias<T> bias = p.bias(t.b, t.h);
    gemm.begin();
    kt.pack(a, z, base + j0, t.h, nk);
    kg.clear(z);
    for (int64_t i0 = j0; i0 < L; i0 += BLK) {
      const int64_t nq = std::min(BLK, L - i0), Mq = round_up(nq, 16), Kq = round_up(nq, 32);
      pack(q + (base + i0) * a.rq + t.h * z.D, a.rq, nq, BLK, z.D, z.Dk, a.act, Qb);
      transpose(Qb, z.Dk, BLK, z.Dk, QT, BLK);
      pack(g + (base + i0) * rg + t.h * z.Dv, rg, nq, BLK, z.Dv, z.Dvk, false, dOb);
      transpose(dOb, z.Dvk, BLK, z.Dvk, dOT, BLK);
      gemm(Mq, Nk, z.Dk, Qb, z.Dk, kt.KT, 2 * BLK, S, BLK, false);
      gemm(Mq, Nk, z.Dvk, dOb, z.Dvk, kt.VT, 2 * BLK, dW, BLK, false);
      TileOut o;
      o.Wp = Wp, o.dSp = dSp, o.Nk = Nk;
      tile_backward(S, dW, i0, j0, nq, nk, Mq, Kk, p, bias, rb, t.h, o);
      gemm(z.Dvk, Nk, Kq, dOT, BLK, Wp, 2 * Nk, kg.dVT, BLK, true);  // dV^T += dO^T W
      gemm(z.Dk, Nk, Kq, QT, BLK, dSp, 2 * Nk, kg.dKT, BLK, true);   // dK^T += Q^T dS
    }
    kg.write(a, z, p, base + j0, t.h, nk, dk, dv);
    gemm.end();
  });
}

}  // namespace
}  // namespace GRLIB_ISA_NS::hstu
#pragma GCC pop_options

// The entry points under the avx512 path's own options (declared so in hstu_attention.h: a
// definition under other target options would be a different function version in C++).
namespace GRLIB_ISA_NS::hstu {

bool on_bf16_units(const Args& a) {
  const int u = ::grlib::isa::units();
  return a.q.scalar_type() == at::kBFloat16 &&
         (u == ::grlib::isa::AMX || (u == ::grlib::isa::DPBF16 && ::grlib::isa::dpbf16_attention.load()));
}

at::Tensor forward_bf16(const Args& a, double alpha) { return forward_impl(a, alpha); }

void backward_bf16(const char* op, int64_t mode, const Args& a, double alpha, const at::Tensor& grad, at::Tensor& dq,
                   at::Tensor& dk, at::Tensor& dv, at::Tensor& dpos, at::Tensor& dtime) {
  TORCH_CHECK(mode >= 0 && mode <= 2, op, ": mode must be 0 (auto), 1 (one pass) or 2 (two passes), got ", mode);
  const bf16::Gemm gemm{::grlib::isa::units() == ::grlib::isa::AMX};
  const bool single = mode == 1 || (mode == 0 && sequence_tasks_balance(sequence_tasks(
                                                     a.offsets.data_ptr<int64_t>(), a.B, a.H)));
  if (single) {
    backward_single(a, alpha, grad, dq, dk, dv, dpos, dtime, gemm);
  } else {
    backward_dq(a, alpha, grad, dq, dpos, dtime, gemm);
    backward_dkv(a, alpha, grad, dk, dv, gemm);
  }
}

}  // namespace GRLIB_ISA_NS::hstu
#endif
