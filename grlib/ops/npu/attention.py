"""Jagged HSTU attention on Ascend NPUs (grlib.ops.npu): the `fbgemm` formulation on NPU tensors."""
from __future__ import annotations

from torch import Tensor

from grlib.ops.npu import require


def hstu_attention(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, max_len: int, alpha: float,
                   pos_bias: Tensor | None = None, time_bias: Tensor | None = None,
                   timestamps: Tensor | None = None) -> Tensor:
    require()
    if q.device.type != "npu":
        raise RuntimeError(f"the 'npu' implementation runs on NPU tensors, got {q.device}")
    from grlib.ops.fbgemm.attention import hstu_attention as padded_via_fbgemm

    return padded_via_fbgemm(q, k, v, offsets, max_len, alpha, pos_bias, time_bias, timestamps)
