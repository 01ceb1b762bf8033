// The jagged HSTU attention ops (design: hstu_attention.h; contract and padded reference:
// grlib/ops/attention.py): their schemas, and the input checks shared by the plain op and the fused
// uvqk op. The kernels: hstu_attention_forward.cpp, hstu_attention_backward.cpp,
// hstu_uvqk_attention.cpp.
#include "hstu_attention.h"
#include "isa.h"

#if !defined(GRLIB_ISA_NS)  // once per path (isa.h), then the registrations
#define GRLIB_ISA_SELF "hstu_attention.cpp"
#include "isa_paths.h"

TORCH_LIBRARY_FRAGMENT(grlib, m) {
  // Jagged causal HSTU attention (contract: grlib/ops/attention.py). The bias tables are optional;
  // time_bias needs timestamps [T] int64.
  m.def("hstu_attention(Tensor q, Tensor k, Tensor v, Tensor offsets, int max_len, float alpha, "
        "Tensor? pos_bias, Tensor? time_bias, Tensor? timestamps) -> Tensor");
  m.def("hstu_attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor offsets, int max_len, "
        "float alpha, Tensor? pos_bias, Tensor? time_bias, Tensor? timestamps, int mode=0) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // HSTU's SiLU + split + attention in one: z [T, 4d] (columns u | v | q | k) -> (SiLU(z_u) [T, d],
  // attention of SiLU(z_q), SiLU(z_k), SiLU(z_v) [T, n_heads, d / n_heads]).
  m.def("hstu_uvqk_attention(Tensor z, Tensor offsets, int max_len, float alpha, int n_heads, Tensor? pos_bias, "
        "Tensor? time_bias, Tensor? timestamps) -> (Tensor, Tensor)");
  m.def("hstu_uvqk_attention_backward(Tensor grad_u, Tensor grad_attn, Tensor z, Tensor offsets, int max_len, "
        "float alpha, int n_heads, Tensor? pos_bias, Tensor? time_bias, Tensor? timestamps, int mode=0) "
        "-> (Tensor, Tensor, Tensor)");
}

#else
namespace GRLIB_ISA_NS {

namespace hstu {

at::Tensor dense_rows(const at::Tensor& t) {
  const bool dense = t.stride(2) == 1 && (t.size(1) <= 1 || t.stride(1) == t.size(2)) && t.stride(0) >= 0;
  return dense ? t : t.contiguous();
}

Args check_args(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& offsets, int64_t max_len, const std::optional<at::Tensor>& pos_bias,
                const std::optional<at::Tensor>& time_bias, const std::optional<at::Tensor>& timestamps) {
  for (const auto* t : {&q, &k, &v, &offsets})
    TORCH_CHECK(t->device().is_cpu(), op, ": every input must be a CPU tensor, got ", t->device());
  TORCH_CHECK(q.dim() == 3 && k.sizes() == q.sizes(), op, ": q and k must both be [T, H, Dqk], got ",
              q.sizes(), " and ", k.sizes());
  TORCH_CHECK(v.dim() == 3 && v.size(0) == q.size(0) && v.size(1) == q.size(1), op,
              ": v must be [T=", q.size(0), ", H=", q.size(1), ", Dv], got ", v.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), op,
              ": q, k, v must share one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), op, ": q, k, v must be floating point, got ",
              q.scalar_type());
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong && offsets.numel() >= 1, op,
              ": offsets must be a 1-D int64 tensor of B+1 >= 1 entries, got ", offsets.sizes(), " ",
              offsets.scalar_type());
  TORCH_CHECK(max_len >= 1, op, ": max_len must be >= 1, got ", max_len);
  Args a;
  a.q = dense_rows(q);
  a.k = dense_rows(k);
  a.v = dense_rows(v);
  a.rq = a.q.stride(0), a.rk = a.k.stride(0), a.rv = a.v.stride(0);
  a.offsets = offsets.contiguous();
  a.T = q.size(0), a.H = q.size(1), a.D = q.size(2), a.Dv = v.size(2), a.B = offsets.numel() - 1;
  a.max_len = max_len;
  const int64_t* o = a.offsets.data_ptr<int64_t>();
  TORCH_CHECK(o[0] == 0, op, ": offsets[0] must be 0, got ", o[0]);
  for (int64_t b = 0; b < a.B; ++b) {
    TORCH_CHECK(o[b + 1] >= o[b], op, ": offsets must be non-decreasing, offsets[", b + 1, "]=", o[b + 1],
                " < offsets[", b, "]=", o[b]);
    TORCH_CHECK(o[b + 1] - o[b] <= max_len, op, ": sequence ", b, " has ", o[b + 1] - o[b],
                " tokens, more than max_len=", max_len, " (truncate the batch first)");
  }
  TORCH_CHECK(o[a.B] == a.T, op, ": offsets[-1]=", o[a.B], " must equal the number of tokens T=", a.T);
  a.has_pos = pos_bias.has_value() && pos_bias->defined();
  a.has_time = time_bias.has_value() && time_bias->defined();
  a.P = a.Bt = 1;
  if (a.has_pos) {
    const auto& t = *pos_bias;
    TORCH_CHECK(t.device().is_cpu() && at::isFloatingType(t.scalar_type()) && t.dim() == 2 &&
                    t.size(0) == a.H && t.size(1) >= 1,
                op, ": pos_bias must be a floating CPU tensor [H=", a.H, ", buckets >= 1], got ", t.sizes(),
                " ", t.scalar_type());
    a.pos = t.contiguous();
    a.P = t.size(1);
  }
  if (a.has_time) {
    const auto& t = *time_bias;
    TORCH_CHECK(t.device().is_cpu() && at::isFloatingType(t.scalar_type()) && t.dim() == 2 &&
                    t.size(0) == a.H && t.size(1) >= 1,
                op, ": time_bias must be a floating CPU tensor [H=", a.H, ", buckets >= 1], got ", t.sizes(),
                " ", t.scalar_type());
    TORCH_CHECK(timestamps.has_value() && timestamps->defined(), op, ": time_bias needs timestamps");
    const auto& s = *timestamps;
    TORCH_CHECK(s.device().is_cpu() && s.scalar_type() == at::kLong && s.dim() == 1 && s.size(0) == a.T, op,
                ": timestamps must be a 1-D int64 CPU tensor of T=", a.T, " entries, got ", s.sizes(), " ",
                s.scalar_type());
    a.time = t.contiguous();
    a.ts = s.contiguous();
    a.Bt = t.size(1);
  }
  return a;
}

}  // namespace hstu

}  // namespace GRLIB_ISA_NS
#endif
