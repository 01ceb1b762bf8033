// Instruction-set paths of grlib._C: each kernel translation unit is compiled once per path, in one
// compiler run, and every op calls the path chosen at run time.
//
//   path     vectors (GRLIB_VBYTES)   register blocks (hstu_tiles.h)        where
//   avx512   64 bytes (zmm)           6 x 4 accumulators of 32 registers    x86-64 with AVX-512 F/BW/DQ/VL
//   avx2     32 bytes (ymm)           6 x 2 accumulators of 16 registers    x86-64 with AVX2 + FMA
//   generic  16 bytes (SSE2 / NEON)   6 x 2                                 any CPU (the only path off x86-64)
//
// How: a kernel file includes this header, then (outside any path) isa_paths.h, which includes the
// file again once per path between `#pragma GCC push_options / target(...)` with GRLIB_ISA_NS set
// to the path's namespace (grlib_avx512, grlib_avx2, grlib_generic); the file's body puts its code
// in namespace GRLIB_ISA_NS, and its op registrations (outside the paths) name GRLIB_DISPATCH(fn),
// a function that calls GRLIB_ISA_NS::fn of the current path. The torch and standard headers are
// included here, before any path, so that their inline functions stay baseline code (and inline
// into every path). The base flags (setup.py) are the baseline ISA: -march=x86-64, or x86-64-v3 for
// GRLIB_ISA_BUILD=x86-64-v3, which also drops the avx512 path (GRLIB_NO_AVX512): no zmm anywhere.
//
// The current path: the widest path this CPU and this build have, until grlib.ops.cpu sets the one
// grlib.hardware.isa selected (GRLIB_ISA) through grlib._C.set_isa.
#pragma once

#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define GRLIB_X86 1
#else
#define GRLIB_X86 0
#endif
#if GRLIB_X86 && !defined(GRLIB_NO_AVX512)
#define GRLIB_BUILD_AVX512 1
#else
#define GRLIB_BUILD_AVX512 0
#endif
#define GRLIB_BUILD_AVX2 GRLIB_X86

namespace grlib::isa {

enum Path : int { GENERIC = 0, AVX2 = 1, AVX512 = 2 };
inline constexpr const char* NAMES[] = {"generic", "avx2", "avx512"};

inline bool built(int p) {
  return p == GENERIC || (p == AVX2 && GRLIB_BUILD_AVX2) || (p == AVX512 && GRLIB_BUILD_AVX512);
}

// Whether this CPU runs path p (cpuid through the compiler's builtin).
inline bool cpu_has(int p) {
#if GRLIB_X86
  __builtin_cpu_init();
  if (p == AVX512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
           __builtin_cpu_supports("fma");
  if (p == AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return p == GENERIC;
}

inline int widest() {
  for (int p = AVX512; p > GENERIC; --p)
    if (built(p) && cpu_has(p)) return p;
  return GENERIC;
}

inline std::atomic<int> current_path{-1};

// bf16 units of the avx512 path (the bf16 attention, hstu_attention_bf16.cpp): NONE converts bf16 to
// float32 and multiplies in float32 (every other path too); DPBF16 multiplies bf16 pairs with
// vdpbf16ps (AVX512-BF16: AMD Zen 4/5, Intel since Cooper Lake); AMX with the AMX-BF16 tile unit
// (Intel Xeon since Sapphire Rapids). The names grlib.hardware.isa gives the avx512 path with them:
// "avx512", "avx512_bf16", "amx".
enum Units : int { NONE = 0, DPBF16 = 1, AMX = 2 };
inline constexpr const char* PATH_NAMES[] = {"avx512", "avx512_bf16", "amx"};

// cpuid: leaf 7 subleaf 1 EAX bit 5 AVX512_BF16; leaf 7 subleaf 0 EDX bit 22 AMX-BF16, bit 24 AMX-TILE
inline bool cpu_has_units(int u) {
  if (u == NONE) return true;
#if GRLIB_X86
  if (!cpu_has(AVX512)) return false;
  unsigned a, b, c, d;
  if (u == DPBF16) return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
  if (u == AMX)
    return cpu_has_units(DPBF16) && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
#endif
  return false;
}

// Linux hands out AMX tile data only to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM,
// XFEATURE_XTILEDATA), once; without it the first tile instruction kills the process (SIGILL).
// Returns "" when granted, else why not.
inline std::string request_amx() {
#if GRLIB_X86 && defined(__linux__)
  static const std::string answer = [] {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0) return std::string();
    return "arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: " + std::string(std::strerror(errno));
  }();
  return answer;
#else
  return "AMX tiles need Linux on x86-64";
#endif
}

inline std::atomic<int> current_units{-1};

// Whether the bf16 attention runs its vdpbf16ps tiles on DPBF16 units (else float32 tiles, as on
// avx512): off unless asked (GRLIB_DPBF16_ATTENTION=1, grlib.ops.cpu), since on the one machine that
// measured them (an AMX Xeon limited to AVX512-BF16) they were slower than the float32 tiles.
inline std::atomic<bool> dpbf16_attention{false};

inline bool built_units(int u) { return u == NONE || GRLIB_BUILD_AVX512; }

// The widest units this CPU and build have (AMX only where Linux grants its tile data).
inline int widest_units() {
  if (built_units(AMX) && cpu_has_units(AMX) && request_amx().empty()) return AMX;
  if (built_units(DPBF16) && cpu_has_units(DPBF16)) return DPBF16;
  return NONE;
}

inline int current() {
  int p = current_path.load(std::memory_order_relaxed);
  if (p < 0) current_path.store(p = widest(), std::memory_order_relaxed);
  return p;
}

// The bf16 units the kernels use now: none off the avx512 path.
inline int units() {
  if (current() != AVX512) return NONE;
  int u = current_units.load(std::memory_order_relaxed);
  if (u < 0) current_units.store(u = widest_units(), std::memory_order_relaxed);
  return u;
}

// fn of the current path (F512, F2, F1: the avx512, avx2, generic builds of one function).
template <auto F512, auto F2, auto F1>
struct Dispatch;
template <typename R, typename... A, R (*F512)(A...), R (*F2)(A...), R (*F1)(A...)>
struct Dispatch<F512, F2, F1> {
  static R call(A... a) {
    switch (current()) {
      case AVX512: return F512(std::forward<A>(a)...);
      case AVX2: return F2(std::forward<A>(a)...);
      default: return F1(std::forward<A>(a)...);
    }
  }
};

}  // namespace grlib::isa

#if GRLIB_BUILD_AVX2
#define GRLIB_FN_AVX2(fn) &grlib_avx2::fn
#else
#define GRLIB_FN_AVX2(fn) &grlib_generic::fn
#endif
#if GRLIB_BUILD_AVX512
#define GRLIB_FN_AVX512(fn) &grlib_avx512::fn
#else
#define GRLIB_FN_AVX512(fn) GRLIB_FN_AVX2(fn)
#endif
#define GRLIB_DISPATCH(fn) (&::grlib::isa::Dispatch<GRLIB_FN_AVX512(fn), GRLIB_FN_AVX2(fn), &grlib_generic::fn>::call)
