"""Ops with one dispatcher each: reference (torch), fbgemm, cpu (grlib._C), onednn, ...: the jagged
conversions and reductions, HSTU attention, the ops around it, the projections' linear, and the
training step's dropout_words and lazy_adam_.

Every public op takes `impl="auto"` (choose by device, see registry.PREFERENCE) or an explicit
implementation name. Feature dims after the token dim are flattened for the kernels and restored.

    >>> v = torch.arange(5.).unsqueeze(1); o = torch.tensor([0, 2, 2, 5])
    >>> jagged_to_padded(v, o, max_len=3)[..., 0]
    tensor([[0., 1., 0.],
            [0., 0., 0.],
            [2., 3., 4.]])
"""
from __future__ import annotations

import importlib
import math

import torch
from torch import Tensor

from grlib.ops import registry
from grlib.ops.jagged import check_jagged, offsets_from_lengths
from grlib.ops.registry import IMPLS, choose, implementations, runnable

__all__ = [
    "IMPLS", "choose", "implementations", "offsets_from_lengths", "runnable",
    "jagged_to_padded", "padded_to_jagged", "segment_sum", "segment_mean", "segment_expand",
    "hstu_attention", "uvqk_attention", "layer_norm_mul", "layer_norm_mul_dropout", "linear", "matmul_nt", "transpose_copy", "embedding_sum", "dropout_words", "lazy_adam_",
]


def _flat(t: Tensor) -> Tensor:
    """[N, *F] -> [N, prod(F)] (also for N = 0)."""
    return t.reshape(t.shape[0], math.prod(t.shape[1:]))


def _loader(module: str, name: str):
    return lambda: getattr(importlib.import_module(f"grlib.ops.{module}"), name)


for _op in ("jagged_to_padded", "padded_to_jagged", "segment_sum", "segment_expand"):
    registry.register(_op, "reference", _loader("reference", _op))
    registry.register(_op, "cpu", _loader("cpu", _op))
for _op in ("jagged_to_padded", "padded_to_jagged", "segment_sum"):
    registry.register(_op, "fbgemm", _loader("fbgemm", _op))


def jagged_to_padded(values: Tensor, offsets: Tensor, max_len: int, padding_value: float = 0.0,
                     impl: str = "auto") -> Tensor:
    """values [T, *F], offsets [B+1] -> [B, max_len, *F]; tokens past max_len are dropped."""
    check_jagged(values, offsets)
    if max_len < 0:
        raise ValueError(f"max_len must be >= 0, got {max_len}")
    fn = registry.resolve("jagged_to_padded", values.device, impl)
    out = fn(_flat(values), offsets, max_len, padding_value)
    return out.reshape(offsets.numel() - 1, max_len, *values.shape[1:])


def padded_to_jagged(padded: Tensor, offsets: Tensor, total: int | None = None, impl: str = "auto") -> Tensor:
    """padded [B, N, *F], offsets [B+1] -> values [T, *F]; tokens past N read as 0.

    `total` (= offsets[-1]) avoids reading offsets back from the device when given."""
    check_jagged(padded, offsets, "padded")
    if padded.dim() < 2 or padded.shape[0] != offsets.numel() - 1:
        raise ValueError(f"padded must be [B={offsets.numel() - 1}, N, ...], got {tuple(padded.shape)}")
    total = int(offsets[-1]) if total is None else total
    fn = registry.resolve("padded_to_jagged", padded.device, impl)
    out = fn(padded.reshape(padded.shape[0], padded.shape[1], math.prod(padded.shape[2:])), offsets, total)
    return out.reshape(total, *padded.shape[2:])


def segment_sum(values: Tensor, offsets: Tensor, impl: str = "auto") -> Tensor:
    """values [T, *F] -> [B, *F]: the sum over each sequence's tokens (0 for empty sequences)."""
    check_jagged(values, offsets)
    fn = registry.resolve("segment_sum", values.device, impl)
    out = fn(_flat(values), offsets)
    return out.reshape(offsets.numel() - 1, *values.shape[1:])


def segment_mean(values: Tensor, offsets: Tensor, impl: str = "auto") -> Tensor:
    """values [T, *F] -> [B, *F]: the mean over each sequence's tokens (0 for empty sequences)."""
    lengths = (offsets[1:] - offsets[:-1]).clamp(min=1).to(values.dtype)
    total = segment_sum(values, offsets, impl)
    return total / lengths.reshape(-1, *([1] * (values.dim() - 1)))


def segment_expand(x: Tensor, offsets: Tensor, total: int | None = None, impl: str = "auto") -> Tensor:
    """x [B, *F] -> [T, *F]: each sequence's row repeated for each of its tokens."""
    check_jagged(x, offsets, "x")
    if x.shape[0] != offsets.numel() - 1:
        raise ValueError(f"x must have B={offsets.numel() - 1} rows, got {x.shape[0]}")
    total = int(offsets[-1]) if total is None else total
    fn = registry.resolve("segment_expand", x.device, impl)
    out = fn(_flat(x), offsets, total)
    return out.reshape(total, *x.shape[1:])


registry.register("hstu_attention", "reference", _loader("attention", "hstu_attention_reference"))
registry.register("hstu_attention", "fbgemm", _loader("fbgemm_attention", "hstu_attention"))
registry.register("hstu_attention", "cpu", _loader("cpu_attention", "hstu_attention"))
registry.register("hstu_attention", "triton", _loader("triton_attention", "hstu_attention"))
registry.register("hstu_attention", "npu", _loader("npu", "hstu_attention"))
registry.register("hstu_attention", "loop", _loader("attention_loop", "hstu_attention_loop"))
registry.register("hstu_attention", "loop_compile", _loader("attention_loop", "hstu_attention_loop_compile"))


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int,
                   alpha: float | None = None, pos_bias: Tensor | None = None,
                   time_bias: Tensor | None = None, timestamps: Tensor | None = None,
                   impl: str = "auto") -> Tensor:
    """Jagged causal HSTU attention: q, k [T, H, Dqk], v [T, H, Dv] -> [T, H, Dv].

    Contract and bias definitions: grlib/ops/attention.py."""
    from grlib.ops.attention import check_attention_args, default_alpha

    check_attention_args(q, k, v, offsets, max_len, pos_bias, time_bias, timestamps)
    alpha = default_alpha(q.shape[-1]) if alpha is None else alpha
    fn = registry.resolve("hstu_attention", q.device, impl)
    return fn(q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps)


def uvqk_attention(z: Tensor, n_heads: int, offsets: Tensor, max_len: int, alpha: float | None = None,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None, impl: str = "auto") -> tuple[Tensor, Tensor]:
    """HSTU's SiLU, split and attention: z [T, 4d] (the fused projection, columns u | v | q | k) ->
    (u = SiLU(z_u) [T, d], hstu_attention(SiLU(z_q), SiLU(z_k), SiLU(z_v)) [T, n_heads, d / n_heads]).

    `impl` is the attention's implementation: `cpu` runs one fused kernel (the activations of q, k, v
    are never written out, and the backward writes dz without a concatenation); the others compose
    F.silu, chunk and their hstu_attention (the reference of the fused kernel)."""
    import torch.nn.functional as F

    from grlib.ops.attention import check_attention_args, default_alpha

    if z.dim() != 2 or z.shape[1] == 0 or z.shape[1] % (4 * n_heads):
        raise ValueError(f"z must be [T, 4 * n_heads * head_dim] with n_heads={n_heads}, got {tuple(z.shape)}")
    T, d = z.shape[0], z.shape[1] // 4
    alpha = default_alpha(d // n_heads) if alpha is None else alpha
    if choose("hstu_attention", z.device, impl) == "cpu":
        view = z[:, :d].reshape(T, n_heads, d // n_heads)
        check_attention_args(view, view, view, offsets, max_len, pos_bias, time_bias, timestamps)
        return registry.resolve("uvqk_attention", z.device, "cpu")(
            z, n_heads, offsets, max_len, alpha, pos_bias, time_bias, timestamps)
    u, v, q, k = F.silu(z).chunk(4, dim=-1)  # 4 x [T, d]
    shape = (T, n_heads, d // n_heads)
    attn = hstu_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape), offsets, max_len, alpha,
                          pos_bias, time_bias, timestamps, impl=impl)
    return u, attn


registry.register("uvqk_attention", "cpu", _loader("cpu_attention", "uvqk_attention"))
registry.register("layer_norm_mul", "reference", _loader("fused", "layer_norm_mul_reference"))
registry.register("layer_norm_mul", "cpu", _loader("cpu_fused", "layer_norm_mul"))


def layer_norm_mul(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                   impl: str = "auto") -> Tensor:
    """LayerNorm(x) * u over the last dim: x, u [..., d], weight, bias [d] -> [..., d] (grlib/ops/fused.py)."""
    from grlib.ops.fused import check_layer_norm_mul_args

    check_layer_norm_mul_args(x, u, weight, bias, eps)
    fn = registry.resolve("layer_norm_mul", x.device, impl)
    d = x.shape[-1]
    return fn(x.reshape(-1, d), u.reshape(-1, d), weight, bias, eps).reshape(x.shape)


registry.register("layer_norm_mul_dropout", "reference", _loader("fused", "layer_norm_mul_dropout_reference"))
registry.register("layer_norm_mul_dropout", "cpu", _loader("cpu_fused", "layer_norm_mul_dropout"))


def layer_norm_mul_dropout(x: Tensor, u: Tensor, weight: Tensor, bias: Tensor, words: Tensor, threshold: int,
                           scale: float, eps: float = 1e-5, impl: str = "auto") -> Tensor:
    """dropout_words(LayerNorm(x) * u, words, threshold, scale) over the last dim: x, u, words [..., d]
    (words int16), weight, bias [d] -> [..., d] in one pass (grlib/ops/fused.py)."""
    from grlib.ops.dropout import check_dropout_words_args
    from grlib.ops.fused import check_layer_norm_mul_args

    check_layer_norm_mul_args(x, u, weight, bias, eps)
    check_dropout_words_args(x, words, threshold)
    fn = registry.resolve("layer_norm_mul_dropout", x.device, impl)
    d = x.shape[-1]
    return fn(x.reshape(-1, d), u.reshape(-1, d), weight, bias, eps, words.reshape(-1, d), threshold,
              scale).reshape(x.shape)


# imported now, not at first use: it registers the FLOP formula of oneDNN's GEMM, which a
# FlopCounterMode reads when it starts (a lazy import inside a counted region went uncounted)
from grlib.ops import matmul as _matmul  # noqa: E402,F401

registry.register("linear", "reference", _loader("matmul", "linear_reference"))
registry.register("linear", "onednn", _loader("matmul", "linear_onednn"))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, impl: str = "auto") -> Tensor:
    """x [..., in] . weight [out, in]^T + bias [out] -> [..., out] (grlib/ops/matmul.py)."""
    from grlib.ops.matmul import check_linear_args

    check_linear_args(x, weight, bias)
    name = registry.choose("linear", x.device, impl)
    if impl == "auto" and name == "onednn" and x.dtype == torch.float32:  # as measured on this machine (grlib.ops.gemm_choice)
        from grlib.ops import gemm_choice

        name = gemm_choice.cpu_linear_impl()
    fn = registry.resolve("linear", x.device, name)
    return fn(x.reshape(-1, x.shape[-1]), weight, bias).reshape(*x.shape[:-1], weight.shape[0])


registry.register("matmul_nt", "reference", _loader("matmul", "matmul_nt_reference"))
registry.register("matmul_nt", "onednn", _loader("matmul", "matmul_nt_onednn"))


def matmul_nt(a: Tensor, b: Tensor, impl: str = "auto") -> Tensor:
    """a [M, K] . b [N, K]^T -> [M, N], no autograd (grlib/ops/matmul.py)."""
    from grlib.ops.matmul import check_matmul_nt_args

    check_matmul_nt_args(a, b)
    return registry.resolve("matmul_nt", a.device, impl)(a, b)


registry.register("embedding_sum", "reference", _loader("embedding", "embedding_sum_reference"))
registry.register("embedding_sum", "cpu", _loader("cpu_train", "embedding_sum"))


def embedding_sum(items: Tensor, actions: Tensor, gaps: Tensor, ids: Tensor, acts: Tensor, gap_idx: Tensor,
                  scale: float, padding_idx: int | None = None, impl: str = "auto") -> Tensor:
    """(items[ids] * scale + actions[acts]) + gaps[gap_idx]: tables [rows, d], indices [T] -> [T, d]
    (grlib/ops/embedding.py)."""
    from grlib.ops.embedding import check_embedding_sum_args

    check_embedding_sum_args(items, actions, gaps, ids, acts, gap_idx)
    return registry.resolve("embedding_sum", items.device, impl)(items, actions, gaps, ids, acts, gap_idx, scale,
                                                                 padding_idx)


registry.register("transpose_copy", "reference", _loader("matmul", "transpose_copy_reference"))
registry.register("transpose_copy", "cpu", _loader("cpu_train", "transpose_copy"))


def transpose_copy(x: Tensor, impl: str = "auto") -> Tensor:
    """x [M, N] -> x^T [N, M] contiguous, no autograd (grlib/ops/matmul.py)."""
    if x.dim() != 2:
        raise ValueError(f"transpose_copy: x must be 2-D [M, N], got {tuple(x.shape)}")
    return registry.resolve("transpose_copy", x.device, impl)(x)


registry.register("dropout_words", "reference", _loader("dropout", "dropout_words_reference"))
registry.register("dropout_words", "cpu", _loader("cpu_train", "dropout_words"))


def dropout_words(x: Tensor, words: Tensor, threshold: int, scale: float, impl: str = "auto") -> Tensor:
    """x * (words >= threshold) * scale: x [*] floating, words [*] int16 -> [*] (grlib/ops/dropout.py)."""
    from grlib.ops.dropout import check_dropout_words_args

    check_dropout_words_args(x, words, threshold)
    return registry.resolve("dropout_words", x.device, impl)(x, words, threshold, scale)


registry.register("lazy_adam_", "reference", _loader("lazy_adam", "lazy_adam_reference"))
registry.register("lazy_adam_", "cpu", _loader("cpu_train", "lazy_adam_"))


def lazy_adam_(w: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: Tensor, lr: float,
               beta1: float, beta2: float, eps: float, impl: str = "auto") -> None:
    """One lazy Adam step in place on the rows of w [V, d] whose grad row is nonzero; moments exp_avg,
    exp_avg_sq [V, d], per-row step counts step [V] float64 (grlib/ops/lazy_adam.py). The cpu kernel
    takes contiguous float32 / float64 tables (grlib.ops.lazy_adam.kernel_fits)."""
    from grlib.ops.lazy_adam import check_lazy_adam_args

    check_lazy_adam_args(w, grad, exp_avg, exp_avg_sq, step)
    registry.resolve("lazy_adam_", w.device, impl)(w, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps)
