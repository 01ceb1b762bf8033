// Includes GRLIB_ISA_SELF (the kernel file that includes this) once per path of isa.h, each between
// the path's target options, with GRLIB_ISA_NS (its namespace) and GRLIB_VBYTES (its vector bytes).
// No include guard: a kernel file includes this once, outside every path.
#if !defined(GRLIB_ISA_SELF) || defined(GRLIB_ISA_NS)
#error "isa_paths.h: define GRLIB_ISA_SELF (the including file) and include it outside every path"
#endif

// the per-path include guards of the shared headers, reset before each path
#undef GRLIB_HSTU_ATTENTION_H
#undef GRLIB_HSTU_SILU_BIAS_H
#undef GRLIB_HSTU_TASKS_H
#undef GRLIB_HSTU_TILES_H
#undef GRLIB_HSTU_BF16_TILES_H
#undef GRLIB_LANE_SUM_H

#if GRLIB_BUILD_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe,popcnt,prefer-vector-width=512")
#define GRLIB_ISA_NS grlib_avx512
#define GRLIB_VBYTES 64
#include GRLIB_ISA_SELF
#undef GRLIB_ISA_NS
#undef GRLIB_VBYTES
#undef GRLIB_HSTU_ATTENTION_H
#undef GRLIB_HSTU_SILU_BIAS_H
#undef GRLIB_HSTU_TASKS_H
#undef GRLIB_HSTU_TILES_H
#undef GRLIB_HSTU_BF16_TILES_H
#undef GRLIB_LANE_SUM_H
#pragma GCC pop_options
#endif

#if GRLIB_BUILD_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2,f16c,lzcnt,movbe,popcnt")
#define GRLIB_ISA_NS grlib_avx2
#define GRLIB_VBYTES 32
#include GRLIB_ISA_SELF
#undef GRLIB_ISA_NS
#undef GRLIB_VBYTES
#undef GRLIB_HSTU_ATTENTION_H
#undef GRLIB_HSTU_SILU_BIAS_H
#undef GRLIB_HSTU_TASKS_H
#undef GRLIB_HSTU_TILES_H
#undef GRLIB_HSTU_BF16_TILES_H
#undef GRLIB_LANE_SUM_H
#pragma GCC pop_options
#endif

// generic: the base flags (baseline x86-64: SSE2; aarch64: NEON)
#define GRLIB_ISA_NS grlib_generic
#define GRLIB_VBYTES 16
#include GRLIB_ISA_SELF
#undef GRLIB_ISA_NS
#undef GRLIB_VBYTES
