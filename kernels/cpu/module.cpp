// grlib._C: the compiled CPU kernels of grlib.
//
// This file owns the Python module and the `grlib` operator namespace. Every other file in
// kernels/cpu/ adds its schemas with TORCH_LIBRARY_FRAGMENT(grlib, m) and its CPU kernels with
// TORCH_LIBRARY_IMPL(grlib, CPU, m). Autograd formulas and fake (meta) implementations are
// registered from Python in grlib/ops/ so that one file shows each op's whole contract.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "isa.h"

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
  // the instruction-set paths (isa.h; selection in grlib.hardware.isa)
  m.def("isa", [] { return std::string(grlib::isa::NAMES[grlib::isa::current()]); },
        "the path every op of grlib._C runs now");
  m.def("isa_paths", [] {
    std::vector<std::string> out;
    for (int p = grlib::isa::AVX512; p >= grlib::isa::GENERIC; --p)
      if (grlib::isa::built(p)) out.emplace_back(grlib::isa::NAMES[p]);
    return out;
  }, "the paths compiled into this build, widest first");
  m.def("isa_cpu_paths", [] {
    std::vector<std::string> out;
    for (int p = grlib::isa::AVX512; p >= grlib::isa::GENERIC; --p)
      if (grlib::isa::cpu_has(p)) out.emplace_back(grlib::isa::NAMES[p]);
    return out;
  }, "the paths this CPU runs (cpuid), widest first");
  m.def("set_isa", [](const std::string& name) {
    for (int p = grlib::isa::GENERIC; p <= grlib::isa::AVX512; ++p)
      if (name == grlib::isa::NAMES[p]) {
        TORCH_CHECK(grlib::isa::built(p), "set_isa: this build of grlib._C has no ", name, " path");
        TORCH_CHECK(grlib::isa::cpu_has(p), "set_isa: this CPU cannot run the ", name, " path");
        grlib::isa::current_path.store(p);
        return;
      }
    TORCH_CHECK(false, "set_isa: unknown path '", name, "' (avx512, avx2, generic)");
  }, "runs every op of grlib._C on the named path from now on");
  m.attr("openmp") =
#ifdef _OPENMP
      true;
#else
      false;
#endif
}
