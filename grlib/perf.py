"""FLOPs of a jagged batch and MFU (the peaks it divides by: grlib.hardware).

FLOPs follow NVIDIA recsys-examples' HSTU accounting (examples/hstu training utilities,
`cal_flops_single_rank`), per layer and per sequence of real length s (never the padded
length), N heads of dim D, hidden H = d_model:

    projections  2*s*4*N*D*H (U,V,Q,K) + 2*s*N*D*H (output)         x3 with backward
    attention    4*N*D*s^2 / 2 (QK^T and AV on the causal triangle)  x3.5 with backward
    elementwise  s*N*D (gate U * A, x2 with backward) + s*H (residual)

(recsys-examples writes the output projection as 2*s*N*H; it multiplies the [s, N*D] gated
attention by the [N*D, H] weight, so it is 2*s*N*D*H: counted here as such.) SASRec counts the
same way: Q,K,V,O projections 2*s*4*H*H, feed-forward 2*2*s*H*F, softmax attention on the causal
triangle. Embedding lookups and the loss are not counted (recsys-examples does not count them).
`loss_flops` gives the sampled softmax's logit products apart (2*P*R*d, x3 with backward; as
Megatron counts the LM head), so a report can show how much of a step goes to work that the HSTU
formula leaves out; MFU itself stays on the HSTU formula.

MFU = useful FLOPs per second / peak FLOP/s, against two peaks (every bench row carries both):

    measured   the best GEMM this machine runs, timed warm in the same run as the steps it
               divides, on-CPU time, best of torch.mm's BLAS and oneDNN (grlib.hardware.gemm,
               re-exported here: measure_peak_flops, measured_peak, peak_flops, Peak)
    nominal    cores x FLOP per cycle x clock, or the vendor's peak on GPU/NPU
               (grlib.hardware.nominal_peak): NVIDIA's convention, and most likely the paper's

    with perf.measured_peak() as peak:     # measures before, and after on exit
        ...steps...
    mfu = perf.mfu(flops, seconds, peak.flops)   # peak.flops = max(before, after)
"""
from __future__ import annotations

import numpy as np
import torch

from grlib.config import ModelConfig
from grlib.hardware import PEAK_SIZES, Peak, gemm_libraries, measure_peak_flops, measured_peak, peak_flops  # noqa: F401
from grlib.model.sasrec import FFN_MULT


def sequence_flops(lengths: np.ndarray | torch.Tensor, cfg: ModelConfig, backward: bool = True) -> float:
    """Useful FLOPs of one training (backward=True) or inference step over sequences of `lengths`."""
    s = np.asarray(lengths, dtype=np.float64)
    N, H = cfg.n_heads, cfg.d_model
    D = H // N
    if cfg.name == "hstu":
        gemm = 2 * s * 4 * N * D * H + 2 * s * N * D * H
        other = s * N * D * (2 if backward else 1) + s * H
    elif cfg.name == "sasrec":
        gemm = 2 * s * 4 * H * H + 2 * 2 * s * H * FFN_MULT * H
        other = np.zeros_like(s)
    else:
        raise ValueError(f"model.name={cfg.name!r} has no FLOPs model (popularity does no training)")
    attn = 4 * N * D * s * s / 2
    if backward:
        gemm, attn = 3 * gemm, 3.5 * attn
    return float(cfg.n_layers * (gemm + attn + other).sum())


def loss_flops(n_tokens: int, n_negatives: int, d_model: int, backward: bool = True) -> float:
    """Logit products of the sampled softmax: P tokens x R negatives x d (per-token or shared pool
    alike); x3 with backward (dL/du and dL/dE). The backward's recomputed logits are not counted."""
    return 2.0 * n_tokens * n_negatives * d_model * (3 if backward else 1)


def batch_flops(offsets: torch.Tensor, cfg: ModelConfig, backward: bool = True) -> float:
    """sequence_flops of a jagged batch, from its offsets [B+1]."""
    return sequence_flops((offsets[1:] - offsets[:-1]).numpy(), cfg, backward)


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: flops / seconds / peak."""
    if seconds <= 0 or peak <= 0:
        raise ValueError(f"mfu needs seconds > 0 and peak > 0, got {seconds}, {peak}")
    return flops / seconds / peak
