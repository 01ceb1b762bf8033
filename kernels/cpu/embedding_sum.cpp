// The input embedding of a token as one op (contract and reference: grlib/ops/embedding.py):
//
//   out[t] = (items[ids[t]] * scale + actions[acts[t]]) + gaps[gaps_idx[t]]     out [T, d]
//
// forward one pass over the tokens (instead of three gathers, a product and two sums, each a
// [T, d] pass of its own), backward one op that returns the three table gradients:
//
//   d_items[r]   = sum over t with ids[t] = r (r != padding_idx) of grad[t] * scale
//   d_actions[r] = sum over t with acts[t] = r of grad[t];   d_gaps likewise
//
// The same float operations in the same order as the reference (torch's embedding, mul and add
// forward; mul, then embedding_dense_backward, which sums each row's tokens in token order starting
// from 0), so the results are bitwise the reference's. Products and sums are rounded one at a time:
// no fused multiply-add (fp-contract off on these functions; GCC would contract by default).
// Forward: parallel over tokens. Backward: the tokens of each row listed in token order (a counting
// sort, O(T + rows)), then parallel over table rows: a worker owns its rows, so no two workers write
// one row and no atomics are needed.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <vector>
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "embedding_sum.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // (items[ids] * scale + actions[acts]) + gaps[gap_idx] -> [T, d] (grlib/ops/embedding.py)
  m.def("embedding_sum(Tensor items, Tensor actions, Tensor gaps, Tensor ids, Tensor acts, Tensor gap_idx, "
        "float scale) -> Tensor");
  // -> (d_items, d_actions, d_gaps); rows `padding_idx` of items get no gradient (-1: none)
  m.def("embedding_sum_backward(Tensor grad, Tensor ids, Tensor acts, Tensor gap_idx, int n_items, int n_actions, "
        "int n_gaps, float scale, int padding_idx) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("embedding_sum", GRLIB_DISPATCH(embedding_sum));
  m.impl("embedding_sum_backward", GRLIB_DISPATCH(embedding_sum_backward));
}

#else
namespace GRLIB_ISA_NS {

namespace {

#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))

void check(const at::Tensor& items, const at::Tensor& actions, const at::Tensor& gaps, const at::Tensor& ids,
           const at::Tensor& acts, const at::Tensor& gap_idx) {
  const char* op = "embedding_sum";
  for (const auto* t : {&items, &actions, &gaps})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 2 && t->size(1) == items.size(1) &&
                    t->scalar_type() == items.scalar_type(),
                op, ": tables must be CPU [rows, d] tensors of one dtype and d, got ", t->sizes(), " ",
                t->scalar_type());
  for (const auto* t : {&ids, &acts, &gap_idx})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 1 && t->scalar_type() == at::kLong && t->numel() == ids.numel(),
                op, ": ids, actions and gap buckets must be int64 [T] with one T, got ", t->sizes(), " ",
                t->scalar_type());
}

void check_range(const at::Tensor& idx, int64_t rows, const char* what) {
  const int64_t* p = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < idx.numel(); ++t)
    TORCH_CHECK(p[t] >= 0 && p[t] < rows, "embedding_sum: ", what, "[", t, "] = ", p[t], " is out of range [0, ",
                rows, ")");
}

template <typename T>
NO_CONTRACT void forward_rows(const T* it, const T* ac, const T* gp, const int64_t* ids, const int64_t* acts,
                              const int64_t* gi, int64_t d, T scale, int64_t t0, int64_t t1, T* out) {
  for (int64_t t = t0; t < t1; ++t) {
    const T *a = it + ids[t] * d, *b = ac + acts[t] * d, *c = gp + gi[t] * d;
    T* o = out + t * d;
    for (int64_t e = 0; e < d; ++e) {
      const T x = a[e] * scale;
      const T y = x + b[e];
      o[e] = y + c[e];
    }
  }
}

// The tokens of each row of a table, in token order (a counting sort): tokens of row r are
// order[start[r] .. start[r + 1]). O(T + rows), serial (a few microseconds per thousand tokens).
struct RowTokens {
  std::vector<int64_t> start, order;
  RowTokens(const int64_t* idx, int64_t n, int64_t rows) : start(rows + 1, 0), order(n) {
    for (int64_t t = 0; t < n; ++t) ++start[idx[t] + 1];
    for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < n; ++t) order[next[idx[t]]++] = t;
  }
};

// rows [r0, r1) of a table's gradient: zeros, then each token of the row in token order (as torch's
// embedding_dense_backward sums them), times `scale` first when `scaled`; row `padding` stays zero
template <typename T>
NO_CONTRACT void backward_rows(const T* g, const RowTokens& rt, int64_t d, T scale, bool scaled, int64_t padding,
                               int64_t r0, int64_t r1, T* out) {
  std::fill(out + r0 * d, out + r1 * d, T(0));
  for (int64_t r = r0; r < r1; ++r) {
    if (r == padding) continue;
    T* o = out + r * d;
    for (int64_t k = rt.start[r]; k < rt.start[r + 1]; ++k) {
      const T* s = g + rt.order[k] * d;
      if (scaled)
        for (int64_t e = 0; e < d; ++e) {
          const T x = s[e] * scale;
          o[e] = o[e] + x;
        }
      else
        for (int64_t e = 0; e < d; ++e) o[e] = o[e] + s[e];
    }
  }
}

at::Tensor embedding_sum(const at::Tensor& items, const at::Tensor& actions, const at::Tensor& gaps,
                         const at::Tensor& ids_in, const at::Tensor& acts_in, const at::Tensor& gap_in, double scale) {
  check(items, actions, gaps, ids_in, acts_in, gap_in);
  const at::Tensor ids = ids_in.contiguous(), acts = acts_in.contiguous(), gi = gap_in.contiguous();
  const at::Tensor it = items.contiguous(), ac = actions.contiguous(), gp = gaps.contiguous();
  const int64_t T_ = ids.numel(), d = items.size(1);
  at::Tensor out = at::empty({T_, d}, items.options());
  check_range(ids, items.size(0), "ids");
  check_range(acts, actions.size(0), "actions");
  check_range(gi, gaps.size(0), "gap buckets");
  AT_DISPATCH_FLOATING_TYPES(items.scalar_type(), "embedding_sum", [&] {
    const scalar_t s = static_cast<scalar_t>(scale);  // as torch multiplies by a Python float
    at::parallel_for(0, T_, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d)), [&](int64_t t0, int64_t t1) {
      forward_rows(it.data_ptr<scalar_t>(), ac.data_ptr<scalar_t>(), gp.data_ptr<scalar_t>(),
                   ids.data_ptr<int64_t>(), acts.data_ptr<int64_t>(), gi.data_ptr<int64_t>(), d, s, t0, t1,
                   out.data_ptr<scalar_t>());
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> embedding_sum_backward(
    const at::Tensor& grad_in, const at::Tensor& ids_in, const at::Tensor& acts_in, const at::Tensor& gap_in,
    int64_t n_items, int64_t n_actions, int64_t n_gaps, double scale, int64_t padding_idx) {
  const at::Tensor grad = grad_in.contiguous(), ids = ids_in.contiguous(), acts = acts_in.contiguous(),
                   gi = gap_in.contiguous();
  TORCH_CHECK(grad.device().is_cpu() && grad.dim() == 2 && grad.size(0) == ids.numel(),
              "embedding_sum_backward: grad must be a CPU [T=", ids.numel(), ", d] tensor, got ", grad.sizes());
  const int64_t T_ = ids.numel(), d = grad.size(1), total = n_items + n_actions + n_gaps;
  auto opts = grad.options();
  at::Tensor di = at::empty({n_items, d}, opts), da = at::empty({n_actions, d}, opts), dg = at::empty({n_gaps, d}, opts);
  check_range(ids, n_items, "ids");
  check_range(acts, n_actions, "actions");
  check_range(gi, n_gaps, "gap buckets");
  const RowTokens ri(ids.data_ptr<int64_t>(), T_, n_items), ra(acts.data_ptr<int64_t>(), T_, n_actions),
      rg(gi.data_ptr<int64_t>(), T_, n_gaps);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "embedding_sum_backward", [&] {
    const scalar_t s = static_cast<scalar_t>(scale);
    const scalar_t* g = grad.data_ptr<scalar_t>();
    // the rows of the three tables back to back; a worker takes a range and fills each table's share
    at::parallel_for(0, total, 256, [&](int64_t r0, int64_t r1) {
      const int64_t a0 = n_items, g0 = n_items + n_actions;
      if (r0 < a0) backward_rows(g, ri, d, s, true, padding_idx, r0, std::min(r1, a0), di.data_ptr<scalar_t>());
      if (r1 > a0 && r0 < g0)
        backward_rows(g, ra, d, s, false, -1, std::max(r0, a0) - a0, std::min(r1, g0) - a0, da.data_ptr<scalar_t>());
      if (r1 > g0) backward_rows(g, rg, d, s, false, -1, std::max(r0, g0) - g0, r1 - g0, dg.data_ptr<scalar_t>());
    });
  });
  return {di, da, dg};
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
