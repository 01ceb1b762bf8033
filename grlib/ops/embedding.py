"""embedding_sum: a token's input embedding, three lookups summed, as one op.

    out[t] = (items[ids[t]] * scale + actions[acts[t]]) + gaps[gap_idx[t]]
    items [V, d], actions [A, d], gaps [G, d]; ids, acts, gap_idx [T] int64 -> out [T, d]

Gradients: d_items[r] sums grad[t] * scale over the tokens with ids[t] = r, except r = padding_idx
(as nn.Embedding(padding_idx=...)); d_actions and d_gaps sum grad[t] over their rows. The reference
is torch's embedding, mul and add (autograd). The compiled CPU kernel (kernels/cpu/embedding_sum.cpp
through grlib.ops.cpu.embedding) does one pass over the tokens forward and one backward, with the
same float operations in the same order, so its outputs and gradients are bitwise the reference's
(tests/test_embedding_sum.py).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from grlib.ops import registry


def check_embedding_sum_args(items: Tensor, actions: Tensor, gaps: Tensor, ids: Tensor, acts: Tensor,
                             gap_idx: Tensor) -> None:
    for name, t in (("items", items), ("actions", actions), ("gaps", gaps)):
        if t.dim() != 2 or t.shape[1] != items.shape[1] or t.dtype != items.dtype:
            raise ValueError(f"embedding_sum: {name} must be [rows, d={items.shape[1]}] {items.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")
    for name, t in (("ids", ids), ("acts", acts), ("gap_idx", gap_idx)):
        if t.dim() != 1 or t.shape != ids.shape or t.is_floating_point():
            raise ValueError(f"embedding_sum: {name} must be integer [T={ids.shape[0]}], got {tuple(t.shape)} {t.dtype}")


def embedding_sum_reference(items: Tensor, actions: Tensor, gaps: Tensor, ids: Tensor, acts: Tensor,
                            gap_idx: Tensor, scale: float, padding_idx: int | None) -> Tensor:
    """[T, d] by F.embedding, * and + (autograd)."""
    return F.embedding(ids, items, padding_idx) * scale + F.embedding(acts, actions) + F.embedding(gap_idx, gaps)


registry.register("embedding_sum", "reference", lambda: embedding_sum_reference)
registry.register("embedding_sum", "cpu", registry.lazy("cpu.embedding", "embedding_sum"))


def embedding_sum(items: Tensor, actions: Tensor, gaps: Tensor, ids: Tensor, acts: Tensor, gap_idx: Tensor,
                  scale: float, padding_idx: int | None = None, impl: str = "auto") -> Tensor:
    """(items[ids] * scale + actions[acts]) + gaps[gap_idx]: tables [rows, d], indices [T] -> [T, d]
    (module doc)."""
    check_embedding_sum_args(items, actions, gaps, ids, acts, gap_idx)
    return registry.resolve("embedding_sum", items.device, impl)(items, actions, gaps, ids, acts, gap_idx, scale,
                                                                 padding_idx)
