// sum_e f(e) for e < d in Acc over L interleaved partial sums: with independent accumulators the
// compiler vectorises the reduction without -ffast-math (the order of the sum is fixed: lane l takes
// e = l, l + L, ...; the tail goes to lane 0; the lanes are then added in order). The LayerNorm
// kernels' row statistics (layer_norm.cpp, layer_norm_mul.cpp).
#include "isa.h"

#include <cstdint>

// once per path (isa.h): GRLIB_ISA_NS is the path's namespace
#if defined(GRLIB_ISA_NS) && !defined(GRLIB_LANE_SUM_H)
#define GRLIB_LANE_SUM_H
namespace GRLIB_ISA_NS {

template <typename Acc, int64_t L = 32, typename F>
inline Acc lane_sum(int64_t d, const F& f) {
  Acc acc[L] = {};
  int64_t e = 0;
  for (; e + L <= d; e += L)
    for (int64_t l = 0; l < L; ++l) acc[l] += f(e + l);
  for (; e < d; ++e) acc[0] += f(e);
  Acc total = 0;
  for (int64_t l = 0; l < L; ++l) total += acc[l];
  return total;
}

}  // namespace GRLIB_ISA_NS
#endif
