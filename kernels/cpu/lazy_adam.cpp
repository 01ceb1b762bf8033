// Lazy (row-wise) Adam on CPU, in place: one pass over an embedding table and its gradient.
//
// For every row r whose gradient row is not all zero (rows the step never touched are left alone,
// moments and step count included):
//
//   n[r] += 1;  c1 = 1 - beta1^n[r];  c2 = 1 - beta2^n[r]          (in double, then cast)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//   w -= lr * (m / c1) / (sqrt(v / c2) + eps)
//
// The same operations in the same order as the PyTorch reference grlib.ops.lazy_adam._adam_rows
// (which gathers the touched rows, updates them and scatters them back: five [V, d] passes and
// three gathers / scatters); here each row is read and written once. Rows are independent
// (at::parallel_for over row chunks).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <initializer_list>
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "lazy_adam.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // In place: Adam on the rows of w [V, d] whose grad row is nonzero; per-row step counts [V] f64.
  m.def("lazy_adam_(Tensor(a!) w, Tensor grad, Tensor(b!) exp_avg, Tensor(c!) exp_avg_sq, Tensor(d!) step, "
        "float lr, float beta1, float beta2, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) { m.impl("lazy_adam_", GRLIB_DISPATCH(lazy_adam_)); }

#else
namespace GRLIB_ISA_NS {

namespace {

constexpr int64_t GRAIN = 64;  // rows per chunk

template <typename T>
void lazy_adam_impl(at::Tensor& w, const at::Tensor& g, at::Tensor& m, at::Tensor& v, at::Tensor& n, double lr,
                    double beta1, double beta2, double eps) {
  const int64_t rows = w.size(0), d = w.size(1);
  T *pw = w.data_ptr<T>(), *pm = m.data_ptr<T>(), *pv = v.data_ptr<T>();
  const T* pg = g.data_ptr<T>();
  double* pn = n.data_ptr<double>();
  const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), a1 = static_cast<T>(1 - beta1),
          a2 = static_cast<T>(1 - beta2), tlr = static_cast<T>(lr), teps = static_cast<T>(eps);
  at::parallel_for(0, rows, GRAIN, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* gr = pg + r * d;
      bool touched = false;
      for (int64_t e = 0; e < d; ++e) touched |= gr[e] != T(0);
      if (!touched) continue;
      pn[r] += 1;
      const T c1 = static_cast<T>(1 - std::pow(beta1, pn[r])), c2 = static_cast<T>(1 - std::pow(beta2, pn[r]));
      T *wr = pw + r * d, *mr = pm + r * d, *vr = pv + r * d;
      for (int64_t e = 0; e < d; ++e) {
        const T ge = gr[e];
        const T me = mr[e] * b1 + a1 * ge;
        const T ve = vr[e] * b2 + a2 * (ge * ge);
        mr[e] = me;
        vr[e] = ve;
        wr[e] -= tlr * (me / c1) / (std::sqrt(ve / c2) + teps);
      }
    }
  });
}

void lazy_adam_(at::Tensor w, const at::Tensor& grad, at::Tensor exp_avg, at::Tensor exp_avg_sq, at::Tensor step,
                double lr, double beta1, double beta2, double eps) {
  const char* op = "lazy_adam_";
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&w, &grad, &exp_avg, &exp_avg_sq, &step})
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous(), op, ": every tensor must be a contiguous CPU tensor");
  TORCH_CHECK(w.dim() == 2, op, ": the parameter must be a 2-D table [V, d], got ", w.sizes());
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&grad, &exp_avg, &exp_avg_sq})
    TORCH_CHECK(t->sizes() == w.sizes() && t->scalar_type() == w.scalar_type(), op,
                ": grad, exp_avg and exp_avg_sq must match the parameter ", w.sizes(), " ", w.scalar_type(),
                ", got ", t->sizes(), " ", t->scalar_type());
  TORCH_CHECK(step.dim() == 1 && step.size(0) == w.size(0) && step.scalar_type() == at::kDouble, op,
              ": step must be float64 [V=", w.size(0), "], got ", step.sizes(), " ", step.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(w.scalar_type(), "lazy_adam_", [&] {
    lazy_adam_impl<scalar_t>(w, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps);
  });
}

}  // namespace

}  // namespace GRLIB_ISA_NS
#endif
