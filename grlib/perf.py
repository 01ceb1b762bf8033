"""FLOPs of a jagged batch, the measured peak of this device, and MFU.

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

MFU = useful FLOPs per second / peak FLOP/s. The peak is measured: a warm fp32 GEMM benchmark
(median of repeats, best of a few square sizes; a cold first GEMM reads about half), cached per
hardware manifest in <data>/cache/peak_flops.json.
"""
from __future__ import annotations

import hashlib
import json
import statistics
import time

import numpy as np
import torch

from grlib import manifest, paths
from grlib.config import ModelConfig
from grlib.model.sasrec import FFN_MULT
from grlib.results import atomic_write_bytes

PEAK_SIZES = (1024, 2048)


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


def measure_peak_flops(sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = 5, warmup: int = 2,
                       dtype: torch.dtype = torch.float32) -> dict:
    """The best median FLOP/s over warm square GEMMs of `sizes` on this CPU, with the per-size figures."""
    per_size = {}
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        out = torch.empty(n, n, dtype=dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=out)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            times.append(time.perf_counter() - start)
        per_size[n] = 2 * n ** 3 / statistics.median(times)
    return {"peak_flops": max(per_size.values()), "per_size": per_size, "dtype": str(dtype).removeprefix("torch."),
            "threads": torch.get_num_threads()}


def hardware_key() -> str:
    """sha256 (12 hex) of the hardware manifest fields a GEMM peak depends on."""
    hw = manifest.hardware()
    fields = {k: hw[k] for k in ("cpu", "cores_logical", "cores_physical", "torch", "device")}
    fields["torch_threads"] = torch.get_num_threads()
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def cache_path():
    return paths.data_dir() / "cache" / "peak_flops.json"


def peak_flops(refresh: bool = False) -> float:
    """This machine's measured fp32 GEMM peak (FLOP/s), cached per hardware manifest."""
    path, key = cache_path(), hardware_key()
    cache = json.loads(path.read_text()) if path.exists() else {}
    if refresh or key not in cache:
        cache[key] = {**measure_peak_flops(), "hardware": manifest.hardware(),
                      "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write_bytes(path, (json.dumps(cache, indent=2, sort_keys=True, default=str) + "\n").encode())
    return float(cache[key]["peak_flops"])


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: flops / seconds / peak."""
    if seconds <= 0 or peak <= 0:
        raise ValueError(f"mfu needs seconds > 0 and peak > 0, got {seconds}, {peak}")
    return flops / seconds / peak
