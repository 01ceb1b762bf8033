// Probes of this CPU core: its clock and its vector FMA throughput (grlib/hardware.py builds the
// nominal peak from the CPU's flags and clock and prints these beside it as the measured check).
//
//   probe_clock(blocks)          -> (dependent adds, thread CPU seconds): a chain of integer adds,
//                                   each waiting for the previous one, runs one add per cycle on
//                                   every x86-64 and AArch64 core, so adds / seconds is the clock.
//                                   The addend is a register, not an immediate: Intel's Golden
//                                   Cove and later fold chains of small immediate adds at rename,
//                                   several per cycle (an Intel Xeon here read 8.59 GHz that way)
//   probe_fma(iters, bf16)       -> (FLOPs, thread CPU seconds) of independent chains of vector
//                                   FMAs at the current path's width (isa.h: 512-bit on avx512,
//                                   256-bit on avx2; generic has none and fails); bf16=true runs
//                                   AVX512-BF16 dot products (vdpbf16ps: 32 bf16 pairs, 64 FLOPs)
//                                   instead, on the avx512 path of a CPU that has them, else fails
//   probe_vector_bits()          -> the current path's FMA loop width in bits (512, 256; 0: none)
//
// Times are the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID): other jobs sharing the core
// do not lower the figures. Both probes run on one thread; the caller multiplies by the cores.
#include <torch/extension.h>

#include "isa.h"

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
  const uint64_t one = 1;
  const double t0 = thread_seconds();
  for (int64_t i = 0; i < blocks; ++i) {
#if defined(__x86_64__)
    asm volatile(GRLIB_R100("add %1, %0\n\t") : "+r"(x) : "r"(one));
#elif defined(__aarch64__)
    asm volatile(GRLIB_R100("add %0, %0, %1\n\t") : "+r"(x) : "r"(one));
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

// the FMA loop of the current path (isa.h): 512-bit on avx512, 256-bit on avx2, none on generic
int64_t probe_vector_bits() {
  const int p = grlib::isa::current();
  return p == grlib::isa::AVX512 ? 512 : p == grlib::isa::AVX2 ? 256 : 0;
}

// 16 (AVX-512: zmm0-15, operands zmm16-17) or 14 (AVX2: ymm0-13, operands ymm14-15) independent
// chains, more than FMA latency (4-5 cycles) x FMA pipes (2): every pipe is busy every cycle. The
// operands are zeros (no denormals, no overflow; the units' throughput does not depend on values).
// Each loop sits in a function compiled for its instructions; none runs unless the path is current.
#if GRLIB_BUILD_AVX512
#define GRLIB_Z(op) op " %%zmm16, %%zmm17, %%zmm0\n\t" op " %%zmm16, %%zmm17, %%zmm1\n\t" \
    op " %%zmm16, %%zmm17, %%zmm2\n\t" op " %%zmm16, %%zmm17, %%zmm3\n\t" op " %%zmm16, %%zmm17, %%zmm4\n\t" \
    op " %%zmm16, %%zmm17, %%zmm5\n\t" op " %%zmm16, %%zmm17, %%zmm6\n\t" op " %%zmm16, %%zmm17, %%zmm7\n\t" \
    op " %%zmm16, %%zmm17, %%zmm8\n\t" op " %%zmm16, %%zmm17, %%zmm9\n\t" op " %%zmm16, %%zmm17, %%zmm10\n\t" \
    op " %%zmm16, %%zmm17, %%zmm11\n\t" op " %%zmm16, %%zmm17, %%zmm12\n\t" op " %%zmm16, %%zmm17, %%zmm13\n\t" \
    op " %%zmm16, %%zmm17, %%zmm14\n\t" op " %%zmm16, %%zmm17, %%zmm15\n\t"
#define GRLIB_ZERO "vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm17, %%zmm17, %%zmm17\n\t" \
    GRLIB_Z("vpxord")  // zmm16 ^ zmm17 = 0
__attribute__((target("avx512f"))) double fma512(uint64_t n) {
  const double flops = 2.0 * 16 * 16 * static_cast<double>(n);
  asm volatile(GRLIB_ZERO "1:\n\t" GRLIB_Z("vfmadd231ps") "dec %0\n\tjnz 1b\n\t"
               : "+r"(n) : : GRLIB_CLOBBER16, "xmm16", "xmm17", "cc");
  return flops;
}
// vdpbf16ps: 16 fp32 lanes, each += two bf16 products: 64 FLOPs per instruction
__attribute__((target("avx512f,avx512bf16"))) double bf16_512(uint64_t n) {
  const double flops = 2.0 * 32 * 16 * static_cast<double>(n);
  asm volatile(GRLIB_ZERO "1:\n\t" GRLIB_Z("vdpbf16ps") "dec %0\n\tjnz 1b\n\t"
               : "+r"(n) : : GRLIB_CLOBBER16, "xmm16", "xmm17", "cc");
  return flops;
}
#endif
#if GRLIB_BUILD_AVX2
#define GRLIB_Y(op) op " %%ymm14, %%ymm15, %%ymm0\n\t" op " %%ymm14, %%ymm15, %%ymm1\n\t" \
    op " %%ymm14, %%ymm15, %%ymm2\n\t" op " %%ymm14, %%ymm15, %%ymm3\n\t" op " %%ymm14, %%ymm15, %%ymm4\n\t" \
    op " %%ymm14, %%ymm15, %%ymm5\n\t" op " %%ymm14, %%ymm15, %%ymm6\n\t" op " %%ymm14, %%ymm15, %%ymm7\n\t" \
    op " %%ymm14, %%ymm15, %%ymm8\n\t" op " %%ymm14, %%ymm15, %%ymm9\n\t" op " %%ymm14, %%ymm15, %%ymm10\n\t" \
    op " %%ymm14, %%ymm15, %%ymm11\n\t" op " %%ymm14, %%ymm15, %%ymm12\n\t" op " %%ymm14, %%ymm15, %%ymm13\n\t"
__attribute__((target("avx2,fma"))) double fma256(uint64_t n) {
  const double flops = 2.0 * 8 * 14 * static_cast<double>(n);
  asm volatile("vxorps %%ymm14, %%ymm14, %%ymm14\n\tvxorps %%ymm15, %%ymm15, %%ymm15\n\t" GRLIB_Y("vxorps")
               "1:\n\t" GRLIB_Y("vfmadd231ps") "dec %0\n\tjnz 1b\n\t"
               : "+r"(n) : : GRLIB_CLOBBER16, "cc");
  return flops;
}
#endif

std::tuple<double, double> probe_fma(int64_t iters, bool bf16) {
  TORCH_CHECK(iters > 0, "probe_fma: iters must be > 0, got ", iters);
  const uint64_t n = static_cast<uint64_t>(iters);
  const int path = grlib::isa::current();
  double flops = 0;
  const double t0 = thread_seconds();
  if (!bf16) {
#if GRLIB_BUILD_AVX512
    if (path == grlib::isa::AVX512) flops = fma512(n);
#endif
#if GRLIB_BUILD_AVX2
    if (path == grlib::isa::AVX2) flops = fma256(n);
#endif
    TORCH_CHECK(flops > 0, "probe_fma: the ", grlib::isa::NAMES[path], " path has no FMA loop (avx512 and avx2 have)");
  } else {
#if GRLIB_BUILD_AVX512
    if (path == grlib::isa::AVX512 && __builtin_cpu_supports("avx512bf16")) flops = bf16_512(n);
#endif
    TORCH_CHECK(flops > 0, "probe_fma: bf16=true needs the avx512 path on a CPU with AVX512-BF16 (path now: ",
                grlib::isa::NAMES[path], ")");
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
