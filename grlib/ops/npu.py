"""Jagged HSTU attention on Ascend NPUs: torch-npu for the device, fbgemm-ascend for the jagged ops.

`import fbgemm_ascend` gives torch.ops.fbgemm.jagged_to_padded_dense / dense_to_jagged NPU kernels
(fbgemm-ascend 1.5.0 ships those, not jagged_dense_bmm); the attention between them is the
reference's dense math (grlib.ops.attention.padded_attention) run by torch-npu. Without both
packages the implementation refuses with an error naming what is missing. Declared for NPU
clusters (pip install -e .[npu]); not run on the CPU machines this project is tested on.
"""
from __future__ import annotations

import math

import importlib

import torch
from torch import Tensor

from grlib.ops.attention import check_lengths, padded_attention

REQUIRED = {"torch_npu": "torch-npu==2.13.0", "fbgemm_ascend": "fbgemm-ascend"}


def require() -> None:
    """Imports torch-npu and fbgemm-ascend; ImportError naming every missing one otherwise."""
    missing = []
    for module, package in REQUIRED.items():
        try:
            importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{package} (import {module}: {err})")
    if missing:
        raise ImportError("the 'npu' implementation needs " + " and ".join(missing) +
                          "; install them with `pip install -e .[npu]` on an Ascend machine")


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    require()
    if q.device.type != "npu":
        raise RuntimeError(f"the 'npu' implementation runs on NPU tensors, got {q.device}")
    check_lengths(offsets, max_len)
    T, H, N = q.shape[0], q.shape[1], max_len
    pad = lambda t: torch.ops.fbgemm.jagged_to_padded_dense(t.reshape(T, math.prod(t.shape[1:])), [offsets], [N], 0.0)  # noqa: E731
    tp = None
    if time_bias is not None:  # int64 timestamps padded by index (exact), [B, N]
        j = torch.arange(N, device=q.device)
        idx = (offsets[:-1, None] + j[None, :]).clamp(max=max(T - 1, 0))
        tp = timestamps[idx]
    out = padded_attention(pad(q), pad(k), pad(v), tp, offsets, N, H, alpha, pos_bias, time_bias)
    return torch.ops.fbgemm.dense_to_jagged(out, [offsets], T)[0].view(T, H, out.shape[-1] // H)
