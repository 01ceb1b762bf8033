"""Ops with one dispatcher (grlib.ops.registry, the one place an op's implementation is looked up):
the jagged conversions and reductions, HSTU attention, the ops around it, the projections' linear,
and the training step's embedding_sum, dropout_words and lazy_adam_.

One module per op holds its contract, its PyTorch reference, its registrations and the public
function (argument checks, then the registry):

    jagged      the layout (offsets_from_lengths); jagged_to_padded, padded_to_jagged, segment_sum,
                segment_mean, segment_expand
    attention   hstu_attention, uvqk_attention
    fused       layer_norm (with L2 normalisation and a bf16 output), layer_norm_mul, layer_norm_mul_dropout,
                residual_add
    matmul      linear, matmul_nt, transpose_copy (and the onednn implementation; gemm_choice: the
                GEMM library `auto` takes for float32 linears on this machine)
    embedding   embedding_sum
    dropout     dropout_words, random_words (the words' counter-based stream)
    lazy_adam   lazy_adam_

One folder per backend holds its implementations, a module per op named as the op's module:
cpu/ (the compiled kernels of grlib._C with their autograd and fake impls), fbgemm/ (the library
baseline), triton/ (CUDA), npu/ (Ascend), loop/ (the attention's per-sequence dense peers).
A new backend of an op is its module there and one registry.register line in the op's module.

Every public op takes `impl="auto"` (choose by device, see registry.PREFERENCE) or an explicit
implementation name. Feature dims after the token dim are flattened for the kernels and restored.

    >>> v = torch.arange(5.).unsqueeze(1); o = torch.tensor([0, 2, 2, 5])
    >>> jagged_to_padded(v, o, max_len=3)[..., 0]
    tensor([[0., 1., 0.],
            [0., 0., 0.],
            [2., 3., 4.]])
"""
from __future__ import annotations

import torch  # noqa: F401  (the doctest's namespace)

from grlib.ops import registry
from grlib.ops.attention import hstu_attention, uvqk_attention
from grlib.ops.dropout import dropout_words, random_words
from grlib.ops.embedding import embedding_sum
from grlib.ops.fused import layer_norm, layer_norm_mul, layer_norm_mul_dropout, residual_add
from grlib.ops.jagged import (jagged_to_padded, offsets_from_lengths, padded_to_jagged, segment_expand,
                              segment_mean, segment_sum)
from grlib.ops.lazy_adam import lazy_adam_
# imported with the package, not at first use: it registers the FLOP formula of oneDNN's GEMM, which
# a FlopCounterMode reads when it starts (a lazy import inside a counted region went uncounted)
from grlib.ops.matmul import linear, matmul_nt, transpose_copy
from grlib.ops.registry import IMPLS, choose, implementations, runnable

__all__ = [
    "IMPLS", "choose", "implementations", "offsets_from_lengths", "registry", "runnable",
    "jagged_to_padded", "padded_to_jagged", "segment_sum", "segment_mean", "segment_expand",
    "hstu_attention", "uvqk_attention", "layer_norm", "layer_norm_mul", "layer_norm_mul_dropout", "residual_add",
    "linear", "matmul_nt",
    "transpose_copy", "embedding_sum", "dropout_words", "random_words", "lazy_adam_",
]
