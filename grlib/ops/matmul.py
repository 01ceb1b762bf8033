"""linear(x, weight, bias): y = x . weight^T + bias, forward and backward, through a GEMM library;
matmul_nt(a, b) = a . b^T without autograd (for the GEMMs inside autograd Functions: the loss).

    x [N, in], weight [out, in], bias [out] or None -> y [N, out]
    a [M, K], b [N, K] (strided views welcome) -> [M, N]

linear(..., dtype=bf16) multiplies in bf16 what may be held in float32 (mixed precision: fp32
weights, a bf16 product): x, weight and bias cast to dtype, and each gradient returned in its own
tensor's dtype, as autograd's casts would (the same values). Through oneDNN the casts happen inside
the op: the weight gradient leaves the transposing copy in float32 directly (transpose_copy's
dtype), where a cast outside took another pass over every weight gradient (aten's ToCopyBackward
copies, about 6 ms of the paper-like bf16 step).

Implementations (grlib.ops.linear(..., impl=...)):
    reference   torch.nn.functional.linear: torch.mm's BLAS (MKL in torch's x86 wheels)
    onednn      the three GEMMs of a linear layer through oneDNN (torch.ops.mkldnn._linear_pointwise,
                which takes dense and strided tensors, no mkldnn layout or weight packing):
                    y  = x . W^T + b         _linear_pointwise(x, W, b)
                    dx = dy . W              _linear_pointwise(dy, W^T)            (a strided view)
                    dW = dy^T . x            _linear_pointwise(x^T, dy^T)^T        (x^T copied by
                                                                            transpose_copy, dy^T a view)
                    db = sum over rows of dy the same product's last row: x^T gets a row of ones
                                             ([in + 1, N], written by transpose_copy; dy.sum(0) over a
                                             bf16 [8192, 6144] took 16 ms here, the extra row of the
                                             product nothing measurable)

Why: MKL's sgemm takes its AVX2 code path on AMD CPUs. On the 2-core AMD EPYC (Zen 5) VM here,
one core ran the HSTU layer's projections ([6891, 256] x [256, 1024] and x [256, 256]) at about
100 GFLOP/s through torch.mm and 215-236 through oneDNN, which uses AVX-512 (dW: 145-180, the
reduction over the 6891 tokens). The weight gradient is written through the transposed product
(x^T . dy^T, then a [out, in] copy), which ran 1.1-1.3x faster than dy^T . x with these shapes.
oneDNN takes the right operand strided but copies a strided left one to contiguous memory through
aten's copy_; x^T [in, N] is made by grlib.ops.transpose_copy instead (the compiled kernel on CPU:
0.8 against 1.8 ms for [6882, 256] here), the same values in the same layout, so the same product.

transpose_copy(x, ones_row=False, dtype=None): x [M, N] -> x^T [N, M] contiguous (ones_row: [N + 1, M],
the last row ones; dtype float32 widens bfloat16 x); reference x.t().contiguous() (then a row of ones
concatenated, then cast), cpu the compiled kernel (kernels/cpu/transpose.cpp through grlib.ops.cpu.matmul).

Which one `auto` takes for float32 on CPU (grlib.ops.gemm_choice): the faster of the two as
measured on the machine at hand, once, and kept for it; GRLIB_GEMM=onednn|blas forces one.
What was measured here: on the 2-core Intel Xeon VM (family 6 model 0xa7, AVX-512) a linear layer's
forward + backward ran 1.05-1.3x faster through MKL at the laptop shapes ([6900, 256] x [256, 1024]
and x [256, 256]) and 1.9-2.4x faster at the paper preset's ([8192, 1536] x [1536, 6144] and x
[1536, 1536]), where oneDNN's products with a strided right operand (dx, dW) ran at 44-68 GFLOP/s
against MKL's 150-230 (docs/MEASUREMENTS.md); on AMD (Zen 4, Zen 5) oneDNN led. bf16 inputs always
take onednn (its bf16 GEMMs, refused where the CPU has none: grlib.hardware.isa).

The oneDNN implementation computes in float32 for float32 inputs (oneDNN's default strict math
mode; no implicit bf16 or tf32) and in bf16 with float32 accumulation for bf16 inputs; it is
tested against the reference (tests/test_linear.py). FlopCounterMode counts its GEMMs
(a flop formula for mkldnn._linear_pointwise is registered here).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from grlib.ops import registry


def check_linear_args(x: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype | None = None) -> None:
    if x.dim() < 1 or weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x [..., in] and weight [out, in] must agree on `in`, got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias must be [out={weight.shape[0]}], got {tuple(bias.shape)}")
    tensors = [x, weight] + ([] if bias is None else [bias])
    if dtype is not None:
        if not dtype.is_floating_point:
            raise TypeError(f"linear: dtype must be a floating point dtype, got {dtype}")
        if not all(t.dtype.is_floating_point for t in tensors):
            raise TypeError(f"linear: with dtype={dtype}, x, weight and bias must be floating point, got "
                            f"{', '.join(str(t.dtype) for t in tensors)}")
    elif x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"linear: x, weight and bias must share one dtype (or pass dtype=), got {x.dtype}, "
                        f"{weight.dtype}{'' if bias is None else ', ' + str(bias.dtype)}")


def linear_reference(x: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype | None = None) -> Tensor:
    """x [N, in] -> [N, out] by torch.nn.functional.linear (autograd), of x, weight, bias cast to dtype."""
    if dtype is not None:
        x, weight, bias = x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)
    return F.linear(x, weight, bias)


def _gemm_nt(a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    """a [M, K] . b[N, K]^T (+ bias [N]) -> [M, N] through oneDNN; a and b may be strided views. An
    empty product (M, N or K = 0; oneDNN refuses those shapes) is written directly: zeros (+ bias)."""
    if a.numel() == 0 or b.numel() == 0:
        out = a.new_zeros((a.shape[0], b.shape[0]))
        return out + bias if bias is not None else out
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class _OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
        # x [N, in] -> [N, out] in dtype (x, weight, bias cast to it; no copy where they are in it)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        x, weight = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x, weight)
        return _gemm_nt(x, weight, None if bias is None else bias.to(dtype))

    @staticmethod
    def backward(ctx, grad: Tensor):  # grad [N, out]
        x, weight = ctx.saved_tensors  # in the product's dtype
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        grad = grad.contiguous()
        dx = _gemm_nt(grad, weight.t()).to(x_dtype) if ctx.needs_input_grad[0] else None  # [N, in]
        dw = db = None
        want_db = b_dtype is not None and ctx.needs_input_grad[2]
        if ctx.needs_input_grad[1]:  # [out, in] from (x^T . dy)^T: both transposes dense copies
            # [in, N], with a row of ones when db is wanted: the product's last row is db [out]
            xt = transpose_copy(x, ones_row=bool(want_db and grad.shape[0]))
            prod = _gemm_nt(xt, grad.t())  # [in (+ 1), out]
            widen = prod.dtype == torch.bfloat16 and w_dtype == torch.float32  # widened as it is transposed
            dw = transpose_copy(prod[:x.shape[1]], dtype=w_dtype if widen else None).to(w_dtype)
            if want_db and grad.shape[0]:  # not a view that keeps prod
                db = prod[x.shape[1]].to(b_dtype, copy=True)
        if want_db and db is None:
            db = grad.sum(0).to(b_dtype)  # [out]
        return dx, dw, db, None


def _check_onednn(op: str) -> None:
    if not torch.backends.mkldnn.is_available():
        raise RuntimeError(f"{op} impl='onednn': this torch build has no oneDNN (torch.backends.mkldnn); "
                           "use impl='reference'")


def linear_onednn(x: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype | None = None) -> Tensor:
    """x [N, in] -> [N, out]: forward and backward GEMMs through oneDNN, in dtype (default x's)."""
    _check_onednn("linear")
    dtype = dtype or x.dtype
    if dtype == torch.bfloat16:  # oneDNN's bf16 GEMMs need AVX512-BF16: a clear error, not a failed primitive
        from grlib.hardware.isa import require_bf16

        require_bf16("linear (bf16 input; model.precision=bf16)")
    return _OneDNNLinear.apply(x.contiguous(), weight, bias, dtype)


def transpose_copy_reference(x: Tensor, ones_row: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    """x [M, N] -> x^T [N, M], contiguous (ones_row: [N + 1, M], the last row ones), in dtype."""
    out = torch.cat([x.t(), x.new_ones(1, x.shape[0])]) if ones_row else x.t().contiguous()
    return out.to(dtype or x.dtype)


def check_matmul_nt_args(a: Tensor, b: Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"matmul_nt: a [M, K] and b [N, K] must agree on K, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul_nt: a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise ValueError("matmul_nt has no autograd: call it on detached tensors or under torch.no_grad() "
                         "(use grlib.ops.linear for a differentiable product)")


def matmul_nt_reference(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] . b [N, K]^T -> [M, N] by torch.mm."""
    return torch.mm(a, b.t())


def matmul_nt_onednn(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] . b [N, K]^T -> [M, N] through oneDNN."""
    _check_onednn("matmul_nt")
    return _gemm_nt(a, b)


@register_flop_formula(torch.ops.mkldnn._linear_pointwise)
def _linear_pointwise_flops(x_shape, w_shape, *args, **kwargs) -> int:
    """2 * M * K * N for x [..., K] . w [N, K]^T."""
    m = 1
    for s in x_shape[:-1]:
        m *= s
    return 2 * m * x_shape[-1] * w_shape[0]


registry.register("linear", "reference", lambda: linear_reference)
registry.register("linear", "onednn", lambda: linear_onednn)
registry.register("matmul_nt", "reference", lambda: matmul_nt_reference)
registry.register("matmul_nt", "onednn", lambda: matmul_nt_onednn)
registry.register("transpose_copy", "reference", lambda: transpose_copy_reference)
registry.register("transpose_copy", "cpu", registry.lazy("cpu.matmul", "transpose_copy"))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, impl: str = "auto",
           dtype: torch.dtype | None = None) -> Tensor:
    """x [..., in] . weight [out, in]^T + bias [out] -> [..., out] in dtype (default: the one all three
    share; else each is cast to it and its gradient comes back in its own dtype) (module doc)."""
    check_linear_args(x, weight, bias, dtype)
    name = registry.choose("linear", x.device, impl)
    if impl == "auto" and name == "onednn" and (dtype or x.dtype) == torch.float32:  # as measured on this
        from grlib.ops import gemm_choice  # machine (grlib.ops.gemm_choice)

        name = gemm_choice.cpu_linear_impl()
    fn = registry.resolve("linear", x.device, name)
    flat = x.reshape(-1, x.shape[-1])
    y = fn(flat, weight, bias) if dtype is None else fn(flat, weight, bias, dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def matmul_nt(a: Tensor, b: Tensor, impl: str = "auto") -> Tensor:
    """a [M, K] . b [N, K]^T -> [M, N], no autograd (module doc)."""
    check_matmul_nt_args(a, b)
    return registry.resolve("matmul_nt", a.device, impl)(a, b)


def transpose_copy(x: Tensor, impl: str = "auto", ones_row: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    """x [M, N] -> x^T [N, M] contiguous (ones_row: [N + 1, M], the last row ones) in dtype (x's, or
    float32 for bfloat16 x), no autograd (module doc)."""
    if x.dim() != 2:
        raise ValueError(f"transpose_copy: x must be 2-D [M, N], got {tuple(x.shape)}")
    if dtype not in (None, x.dtype) and not (x.dtype == torch.bfloat16 and dtype == torch.float32):
        raise TypeError(f"transpose_copy: dtype must be x's or, for bfloat16 x, float32; got {x.dtype} -> {dtype}")
    return registry.resolve("transpose_copy", x.device, impl)(x, ones_row, dtype)
