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
  // the instruction-set paths (isa.h; selection in grlib.hardware.isa): the avx512 path is named by
  // its bf16 units ("amx", "avx512_bf16", "avx512"), the others by themselves
  namespace isa = grlib::isa;
  struct Named {
    std::string name;
    int path, units;
  };
  auto all = [] {
    std::vector<Named> out;  // widest first
    for (int u = isa::AMX; u >= isa::NONE; --u) out.push_back({isa::PATH_NAMES[u], isa::AVX512, u});
    for (int p = isa::AVX2; p >= isa::GENERIC; --p) out.push_back({isa::NAMES[p], p, isa::NONE});
    return out;
  };
  m.def("isa", [] {
    return std::string(isa::current() == isa::AVX512 ? isa::PATH_NAMES[isa::units()] : isa::NAMES[isa::current()]);
  }, "the path every op of grlib._C runs now");
  m.def("isa_paths", [all] {
    std::vector<std::string> out;
    for (const Named& n : all())
      if (isa::built(n.path) && isa::built_units(n.units)) out.push_back(n.name);
    return out;
  }, "the paths compiled into this build, widest first");
  m.def("isa_cpu_paths", [all] {
    std::vector<std::string> out;
    for (const Named& n : all())
      if (isa::cpu_has(n.path) && isa::cpu_has_units(n.units)) out.push_back(n.name);
    return out;
  }, "the paths this CPU runs (cpuid), widest first");
  m.def("set_isa", [all](const std::string& name) {
    for (const Named& n : all())
      if (name == n.name) {
        TORCH_CHECK(isa::built(n.path) && isa::built_units(n.units), "set_isa: this build of grlib._C has no ", name,
                    " path");
        TORCH_CHECK(isa::cpu_has(n.path) && isa::cpu_has_units(n.units), "set_isa: this CPU cannot run the ", name,
                    " path");
        if (n.units == isa::AMX) {
          const std::string why = isa::request_amx();
          TORCH_CHECK(why.empty(), "set_isa: the amx path needs Linux's permission to use AMX tile data, refused: ",
                      why, " (GRLIB_ISA=avx512_bf16 runs without AMX)");
        }
        isa::current_path.store(n.path);
        isa::current_units.store(n.units);
        return;
      }
    TORCH_CHECK(false, "set_isa: unknown path '", name, "' (amx, avx512_bf16, avx512, avx2, generic)");
  }, "runs every op of grlib._C on the named path from now on");
  m.def("set_dpbf16_attention", [](bool on) { isa::dpbf16_attention.store(on); },
        "the bf16 attention's vdpbf16ps tiles on the avx512_bf16 path (else float32 tiles)");
  m.def("dpbf16_attention", [] { return isa::dpbf16_attention.load(); });
  m.attr("openmp") =
#ifdef _OPENMP
      true;
#else
      false;
#endif
}
