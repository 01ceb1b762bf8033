// Jagged <-> padded conversion and per-sequence reductions (CPU, OpenMP through at::parallel_for).
//
// Layout (B = 3 sequences of lengths 2, 0, 3; D features per token):
//
//   values  [T=5, D]   a0 a1 | | c0 c1 c2
//   offsets [B+1=4]    0  2  2  5
//   padded  [B, N, D]  row 0: a0 a1 pad..   row 1: pad..   row 2: c0 c1 c2 (N >= 3)
//
// Tokens past N are dropped by jagged_to_padded and read as 0 by padded_to_jagged, so each op's
// gradient is the other one.
#include <torch/extension.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

namespace {

// Checks that offsets is a 1-D int64 CPU tensor starting at 0, non-decreasing, ending at `total`.
void check_offsets(const at::Tensor& offsets, int64_t total, const char* op) {
  TORCH_CHECK(offsets.dim() == 1 && offsets.scalar_type() == at::kLong,
              op, ": offsets must be a 1-D int64 tensor, got dim ", offsets.dim(), " dtype ",
              offsets.scalar_type());
  TORCH_CHECK(offsets.numel() >= 1, op, ": offsets must have B+1 >= 1 entries");
  auto o = offsets.accessor<int64_t, 1>();
  TORCH_CHECK(o[0] == 0, op, ": offsets[0] must be 0, got ", o[0]);
  for (int64_t b = 1; b < offsets.numel(); ++b) {
    TORCH_CHECK(o[b] >= o[b - 1], op, ": offsets must be non-decreasing, offsets[", b, "]=", o[b],
                " < offsets[", b - 1, "]=", o[b - 1]);
  }
  TORCH_CHECK(o[offsets.numel() - 1] == total, op, ": offsets[-1]=", o[offsets.numel() - 1],
              " must equal the number of jagged rows ", total);
}

void check_values(const at::Tensor& t, int64_t dim, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must have ", dim, " dims, got ", t.dim());
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name,
              " must be floating point, got ", t.scalar_type());
}

}  // namespace

// values [T, D], offsets [B+1] -> padded [B, max_len, D]
at::Tensor jagged_to_padded(const at::Tensor& values_in, const at::Tensor& offsets_in,
                            int64_t max_len, double padding_value) {
  check_values(values_in, 2, "jagged_to_padded", "values");
  TORCH_CHECK(max_len >= 0, "jagged_to_padded: max_len must be >= 0, got ", max_len);
  auto values = values_in.contiguous();
  auto offsets = offsets_in.contiguous();
  check_offsets(offsets, values.size(0), "jagged_to_padded");
  const int64_t B = offsets.numel() - 1, D = values.size(1);
  auto out = at::empty({B, max_len, D}, values.options());
  const int64_t* o = offsets.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "jagged_to_padded", [&] {
    const scalar_t* v = values.data_ptr<scalar_t>();
    scalar_t* p = out.data_ptr<scalar_t>();
    const scalar_t pad = static_cast<scalar_t>(padding_value);
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t len = std::min(o[b + 1] - o[b], max_len);
        scalar_t* dst = p + b * max_len * D;
        std::copy(v + o[b] * D, v + (o[b] + len) * D, dst);
        std::fill(dst + len * D, dst + max_len * D, pad);
      }
    });
  });
  return out;
}

// padded [B, N, D], offsets [B+1] -> values [total, D]
at::Tensor padded_to_jagged(const at::Tensor& padded_in, const at::Tensor& offsets_in, int64_t total) {
  check_values(padded_in, 3, "padded_to_jagged", "padded");
  auto padded = padded_in.contiguous();
  auto offsets = offsets_in.contiguous();
  check_offsets(offsets, total, "padded_to_jagged");
  const int64_t B = offsets.numel() - 1, N = padded.size(1), D = padded.size(2);
  TORCH_CHECK(padded.size(0) == B, "padded_to_jagged: padded has ", padded.size(0),
              " rows but offsets describe ", B, " sequences");
  auto out = at::empty({total, D}, padded.options());
  const int64_t* o = offsets.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, padded.scalar_type(), "padded_to_jagged", [&] {
    const scalar_t* p = padded.data_ptr<scalar_t>();
    scalar_t* v = out.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t len = o[b + 1] - o[b], kept = std::min(len, N);
        const scalar_t* src = p + b * N * D;
        std::copy(src, src + kept * D, v + o[b] * D);
        std::fill(v + (o[b] + kept) * D, v + (o[b] + len) * D, scalar_t(0));
      }
    });
  });
  return out;
}

// values [T, D], offsets [B+1] -> sums [B, D] (accumulated in float for half types)
at::Tensor segment_sum(const at::Tensor& values_in, const at::Tensor& offsets_in) {
  check_values(values_in, 2, "segment_sum", "values");
  auto values = values_in.contiguous();
  auto offsets = offsets_in.contiguous();
  check_offsets(offsets, values.size(0), "segment_sum");
  const int64_t B = offsets.numel() - 1, D = values.size(1);
  auto out = at::empty({B, D}, values.options());
  const int64_t* o = offsets.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, values.scalar_type(), "segment_sum", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* v = values.data_ptr<scalar_t>();
    scalar_t* s = out.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      std::vector<acc_t> acc(D);
      for (int64_t b = b0; b < b1; ++b) {
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t t = o[b]; t < o[b + 1]; ++t) {
          const scalar_t* row = v + t * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += static_cast<acc_t>(row[d]);
        }
        for (int64_t d = 0; d < D; ++d) s[b * D + d] = static_cast<scalar_t>(acc[d]);
      }
    });
  });
  return out;
}

// x [B, D], offsets [B+1] -> values [total, D] with values[t] = x[b] for every token t of b
at::Tensor segment_expand(const at::Tensor& x_in, const at::Tensor& offsets_in, int64_t total) {
  check_values(x_in, 2, "segment_expand", "x");
  auto x = x_in.contiguous();
  auto offsets = offsets_in.contiguous();
  check_offsets(offsets, total, "segment_expand");
  const int64_t B = offsets.numel() - 1, D = x.size(1);
  TORCH_CHECK(x.size(0) == B, "segment_expand: x has ", x.size(0), " rows but offsets describe ",
              B, " sequences");
  auto out = at::empty({total, D}, x.options());
  const int64_t* o = offsets.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "segment_expand", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* v = out.data_ptr<scalar_t>();
    at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        for (int64_t t = o[b]; t < o[b + 1]; ++t) std::copy(src + b * D, src + (b + 1) * D, v + t * D);
    });
  });
  return out;
}

TORCH_LIBRARY_IMPL(grlib, CPU, m) {
  m.impl("jagged_to_padded", &jagged_to_padded);
  m.impl("padded_to_jagged", &padded_to_jagged);
  m.impl("segment_sum", &segment_sum);
  m.impl("segment_expand", &segment_expand);
}
