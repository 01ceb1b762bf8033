// Probes of this CPU core: its clock and its vector FMA throughput (grlib/hardware.py builds the
// nominal peak from the CPU's flags and clock and prints these beside it as the measured check).
//
//   probe_clock(blocks)          -> (dependent adds, thread CPU seconds): a chain of integer adds,
//                                   each waiting for the previous one, runs one add per cycle on
//                                   every x86-64 and AArch64 core, so adds / seconds is the clock
//   probe_fma(iters, bf16)       -> (FLOPs, thread CPU seconds) of independent chains of vector
//                                   FMAs (the widest vectors this build targets: 512-bit with
//                                   AVX-512, else 256-bit with AVX2+FMA; x86-64 only); bf16=true
//                                   runs AVX512-BF16 dot products (vdpbf16ps: 32 bf16 pairs, 64
//                                   FLOPs) instead; a build without the instructions fails
//   probe_vector_bits()          -> the FMA loop's vector width in bits (512, 256; 0: none)
//
// Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): other jobs sharing the core
// do not lower the figures. Both probes run on one thread; the caller multiplies by the cores.
#include <torch/extension.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <ctime>
#include <tuple>

namespace {

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

#define GRLIB_R4(s) s s s s
#define GRLIB_R20(s) GRLIB_R4(s) GRLIB_R4(s) GRLIB_R4(s) GRLIB_R4(s) GRLIB_R4(s)
#define GRLIB_R100(s) GRLIB_R20(s) GRLIB_R20(s) GRLIB_R20(s) GRLIB_R20(s) GRLIB_R20(s)

std::tuple<double, double> probe_clock(int64_t blocks) {
  TORCH_CHECK(blocks > 0, "probe_clock: blocks must be > 0, got ", blocks);
  uint64_t x = 0;
  const double t0 = thread_seconds();
  for (int64_t i = 0; i < blocks; ++i) {
#if defined(__x86_64__)
    asm volatile(GRLIB_R100("add $1, %0\n\t") : "+r"(x));
#elif defined(__aarch64__)
    asm volatile(GRLIB_R100("add %0, %0, #1\n\t") : "+r"(x));
#else
    TORCH_CHECK(false, "probe_clock: only x86-64 and AArch64 builds have the add chain");
#endif
  }
  const double seconds = thread_seconds() - t0;
  TORCH_CHECK(x == static_cast<uint64_t>(blocks) * 100, "probe_clock: the add chain miscounted");
  return {static_cast<double>(blocks) * 100.0, seconds};
}

// The FMA loop: all in one asm block, so that the accumulators never leave their registers (a C
// loop over a vector array kept them on the stack, and store-to-load forwarding then set the pace).
#define GRLIB_R2(s) s s
#define GRLIB_R8(s) GRLIB_R4(s) GRLIB_R4(s)
#define GRLIB_CLOBBER16 "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
    "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15"

#if defined(__x86_64__) && defined(__AVX512F__)
constexpr int64_t VECTOR_BITS = 512;
#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
constexpr int64_t VECTOR_BITS = 256;
#else
constexpr int64_t VECTOR_BITS = 0;  // no FMA loop for this build
#endif

int64_t probe_vector_bits() { return VECTOR_BITS; }

// 16 (AVX-512: zmm0-15, operands zmm16-17) or 14 (AVX2: ymm0-13, operands ymm14-15) independent
// chains, more than FMA latency (4-5 cycles) x FMA pipes (2): every pipe is busy every cycle. The
// operands are zeros (no denormals, no overflow; the units' throughput does not depend on values).
std::tuple<double, double> probe_fma(int64_t iters, bool bf16) {
  TORCH_CHECK(iters > 0, "probe_fma: iters must be > 0, got ", iters);
  uint64_t n = static_cast<uint64_t>(iters);
  double flops = 0;
  const double t0 = thread_seconds();
  if (!bf16) {
#if defined(__x86_64__) && defined(__AVX512F__)
#define GRLIB_Z(op) op " %%zmm16, %%zmm17, %%zmm0\n\t" op " %%zmm16, %%zmm17, %%zmm1\n\t" \
    op " %%zmm16, %%zmm17, %%zmm2\n\t" op " %%zmm16, %%zmm17, %%zmm3\n\t" op " %%zmm16, %%zmm17, %%zmm4\n\t" \
    op " %%zmm16, %%zmm17, %%zmm5\n\t" op " %%zmm16, %%zmm17, %%zmm6\n\t" op " %%zmm16, %%zmm17, %%zmm7\n\t" \
    op " %%zmm16, %%zmm17, %%zmm8\n\t" op " %%zmm16, %%zmm17, %%zmm9\n\t" op " %%zmm16, %%zmm17, %%zmm10\n\t" \
    op " %%zmm16, %%zmm17, %%zmm11\n\t" op " %%zmm16, %%zmm17, %%zmm12\n\t" op " %%zmm16, %%zmm17, %%zmm13\n\t" \
    op " %%zmm16, %%zmm17, %%zmm14\n\t" op " %%zmm16, %%zmm17, %%zmm15\n\t"
#define GRLIB_ZERO "vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t" \
    GRLIB_Z("vpxord")  // zmm16 ^ zmm17 = 0
    asm volatile(GRLIB_ZERO "1:\n\t" GRLIB_Z("vfmadd231ps") "dec %0\n\tjnz 1b\n\t"
                 : "+r"(n) : : GRLIB_CLOBBER16, "xmm16", "xmm17", "cc");
    flops = 2.0 * 16 * 16 * static_cast<double>(iters);
#elif defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#define GRLIB_Y(op) op " %%ymm14, %%ymm15, %%ymm0\n\t" op " %%ymm14, %%ymm15, %%ymm1\n\t" \
    op " %%ymm14, %%ymm15, %%ymm2\n\t" op " %%ymm14, %%ymm15, %%ymm3\n\t" op " %%ymm14, %%ymm15, %%ymm4\n\t" \
    op " %%ymm14, %%ymm15, %%ymm5\n\t" op " %%ymm14, %%ymm15, %%ymm6\n\t" op " %%ymm14, %%ymm15, %%ymm7\n\t" \
    op " %%ymm14, %%ymm15, %%ymm8\n\t" op " %%ymm14, %%ymm15, %%ymm9\n\t" op " %%ymm14, %%ymm15, %%ymm10\n\t" \
    op " %%ymm14, %%ymm15, %%ymm11\n\t" op " %%ymm14, %%ymm15, %%ymm12\n\t" op " %%ymm14, %%ymm15, %%ymm13\n\t"
    asm volatile("vxorps %%ymm14, %%ymm14, %%ymm14\n\tvxorps %%ymm15, %%ymm15, %%ymm15\n\t" GRLIB_Y("vxorps")
                 "1:\n\t" GRLIB_Y("vfmadd231ps") "dec %0\n\tjnz 1b\n\t"
                 : "+r"(n) : : GRLIB_CLOBBER16, "cc");
    flops = 2.0 * 8 * 14 * static_cast<double>(iters);
#else
    TORCH_CHECK(false, "probe_fma: this build has no FMA loop (x86-64 with AVX2+FMA or AVX-512 only)");
#endif
  } else {
#if defined(__x86_64__) && defined(__AVX512BF16__)
    // vdpbf16ps: 16 fp32 lanes, each += two bf16 products: 64 FLOPs per instruction
    asm volatile(GRLIB_ZERO "1:\n\t" GRLIB_Z("vdpbf16ps") "dec %0\n\tjnz 1b\n\t"
                 : "+r"(n) : : GRLIB_CLOBBER16, "xmm16", "xmm17", "cc");
    flops = 2.0 * 32 * 16 * static_cast<double>(iters);
#else
    TORCH_CHECK(false, "probe_fma: bf16=true needs a build with AVX512-BF16 (-march=native on such a CPU)");
#endif
  }
  return {flops, thread_seconds() - t0};
}

}  // namespace

// No tensor arguments: each op is registered with its one (catch-all) kernel.
TORCH_LIBRARY_FRAGMENT(grlib, m) {
  m.def("probe_clock(int blocks) -> (float, float)", &probe_clock);
  m.def("probe_fma(int iters, bool bf16) -> (float, float)", &probe_fma);
  m.def("probe_vector_bits() -> int", &probe_vector_bits);
}
