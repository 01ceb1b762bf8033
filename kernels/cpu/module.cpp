// grlib._C: the compiled CPU kernels of grlib.
//
// This file owns the Python module and the `grlib` operator namespace. Every other file in
// kernels/cpu/ adds its schemas with TORCH_LIBRARY_FRAGMENT(grlib, m) and its CPU kernels with
// TORCH_LIBRARY_IMPL(grlib, CPU, m). Autograd formulas and fake (meta) implementations are
// registered from Python in grlib/ops/ so that one file shows each op's whole contract.
#include <torch/extension.h>

TORCH_LIBRARY(grlib, m) {
  // Jagged layout: values [T, D] hold the B sequences back to back, offsets [B+1] (int64)
  // mark where each starts: sequence b is values[offsets[b]:offsets[b+1]].
  m.def("jagged_to_padded(Tensor values, Tensor offsets, int max_len, float padding_value) -> Tensor");
  m.def("padded_to_jagged(Tensor padded, Tensor offsets, int total) -> Tensor");
  m.def("segment_sum(Tensor values, Tensor offsets) -> Tensor");
  m.def("segment_expand(Tensor x, Tensor offsets, int total) -> Tensor");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "grlib compiled CPU kernels; the ops live in torch.ops.grlib";
  m.attr("openmp") =
#ifdef _OPENMP
      true;
#else
      false;
#endif
}
