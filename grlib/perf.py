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

MFU = useful FLOPs per second / peak FLOP/s. The peak is measured in the same run as the steps it
divides, never cached: a warm fp32 GEMM benchmark (median of 5 repeats, best of the square sizes
1024 and 2048; a cold first GEMM reads about half; about 0.7 s on 2 cores), each GEMM timed by its
on-CPU time, so that other jobs' share of the cores does not pass for a lower peak (see
measure_peak_flops). A peak cached while the machine was busy read 81.6 instead of 367 GFLOP/s and
made every later MFU 4.5x too high. Around a run of steps:

    with perf.measured_peak() as peak:     # measures before, and after on exit
        ...steps...
    mfu = perf.mfu(flops, seconds, peak.flops)   # peak.flops = max(before, after)

The higher of the two is used: load that comes or goes during the steps can only lower a
measurement, so the higher one is the closer to the machine's peak (and gives the lower MFU).
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from grlib.config import ModelConfig
from grlib.model.sasrec import FFN_MULT

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
    """The fp32 GEMM peak of this CPU: the best over `sizes` of the median rate of warm square GEMMs.

    A GEMM's time is its on-CPU time: min(wall, process CPU time / threads). Quiet, the two agree
    (within the threads' idle share at the end of a GEMM). When other jobs share the cores, the
    wall time also counts the time the threads waited for a core, and a wall-clock peak falls with
    the load (2 busy processes on 2 cores: about half) while the steps it divides are hit less
    (their serial parts wait for one core, not two), so MFU would rise with the load; the on-CPU
    rate is the hardware's. The min keeps the peak at or above the wall-clock one (never an MFU
    above the wall-clock MFU) should another thread of this process burn CPU meanwhile.
    Returns peak_flops, peak_flops_wall (the same from wall times alone) and both per size."""
    threads = torch.get_num_threads()
    per_size, per_size_wall = {}, {}
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        out = torch.empty(n, n, dtype=dtype)
        for _ in range(warmup):
            torch.mm(a, b, out=out)
        walls, on_cpu = [], []
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            torch.mm(a, b, out=out)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            walls.append(wall)
            on_cpu.append(min(wall, cpu / threads))
        per_size[n] = 2 * n ** 3 / statistics.median(on_cpu)
        per_size_wall[n] = 2 * n ** 3 / statistics.median(walls)
    return {"peak_flops": max(per_size.values()), "peak_flops_wall": max(per_size_wall.values()),
            "per_size": per_size, "per_size_wall": per_size_wall, "dtype": str(dtype).removeprefix("torch."),
            "threads": threads}


def peak_flops() -> float:
    """This machine's fp32 GEMM peak (FLOP/s), measured now (no cache: it sees the load of this moment)."""
    return float(measure_peak_flops()["peak_flops"])


@dataclass
class Peak:
    """The GEMM peak (FLOP/s) measured before and after a run of steps (measured_peak)."""
    before: float
    after: float = math.nan  # set when the `with` block ends
    before_wall: float = math.nan  # the same from wall times alone (measure_peak_flops' peak_flops_wall)
    after_wall: float = math.nan

    @property
    def flops(self) -> float:
        """The peak MFU divides by: the higher of before and after."""
        if math.isnan(self.after):
            raise RuntimeError("Peak.flops read inside its measured_peak() block: "
                               "the after-measurement is not taken yet")
        return max(self.before, self.after)

    @property
    def flops_wall(self) -> float:
        return max(self.before_wall, self.after_wall)


@contextlib.contextmanager
def measured_peak(sizes: tuple[int, ...] = PEAK_SIZES) -> Iterator[Peak]:
    """Measures the GEMM peak before the block and after it (not after an exception)."""
    m = measure_peak_flops(sizes)
    peak = Peak(before=m["peak_flops"], before_wall=m["peak_flops_wall"])
    yield peak
    m = measure_peak_flops(sizes)
    peak.after, peak.after_wall = m["peak_flops"], m["peak_flops_wall"]


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation: flops / seconds / peak."""
    if seconds <= 0 or peak <= 0:
        raise ValueError(f"mfu needs seconds > 0 and peak > 0, got {seconds}, {peak}")
    return flops / seconds / peak
