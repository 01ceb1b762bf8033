"""Per-rank work of data-parallel steps, for grlib.sim.pipeline.simulate: a compute model fitted to
measured steps, and the loads of global batches at cluster scale.

    compute = fit_step_compute(layer_cost, n_layers, lengths_per_step, seconds)   # measured one-rank steps
    compute(lengths)   # seconds = c0 + kappa * n_layers * sum_s layer(s) + per_token * T  (c0, kappa, per_token >= 0)

At cluster scale each step draws P x U users' lengths from a pool (real length distributions), cut at max_len; a
balancer (grlib.distributed.balance) assigns them to ranks on their training FLOPs (grlib.distributed.cost.FlopsCost);
each rank's compute is its FLOPs at a device's dense peak times a measured efficiency:

    fused     sequence_flops (grlib.perf: the causal triangle of real lengths)  / (peak * efficiency)
    padded    the same with every sequence's attention over the full M x M square of its micro-batch's
              longest M (the padded reference: dense masked scores), projections on real tokens
    loss      the sampled softmax's logits (grlib.perf.loss_flops) at the same efficiency
    optimizer AdamW over the dense parameters, memory-bound: 28 bytes per parameter (read p, g, m, v;
              write p, m, v in fp32) / the device's memory bandwidth

forward = the forward FLOPs, backward = the rest. The item rows each rank asks every other rank for
(one lookup's trip, per peer): tokens x rows_per_token / P (input) and (tokens x rows_per_token +
shared negatives) / P (loss: targets and the shared pool).

    loads = cluster_loads(pool, 512, Workload(cfg.model, 32, 4096, 512, 4, dense, 0.6), DEVICES["h100-bf16"],
                          efficiency=0.4, method="kk", steps=5)
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from grlib.config import ModelConfig
from grlib.distributed.balance import assign
from grlib.distributed.cost import FlopsCost
from grlib.perf import loss_flops, sequence_flops
from grlib.sim.pipeline import StepLoad

@dataclass(frozen=True)
class StepCompute:
    """Seconds of one rank's step compute = c0 + kappa * n_layers * sum_s layer(s) + per_token * T."""

    c0: float
    kappa: float
    per_token: float
    n_layers: int
    layer: Callable[[np.ndarray], np.ndarray]  # [B] lengths -> [B] seconds of one layer (grlib.distributed.cost)
    r2: float = math.nan
    residuals: tuple[float, ...] = ()  # measured / fitted - 1 per step

    def __call__(self, lengths) -> float:
        s = np.asarray(lengths, dtype=np.float64)
        return float(self.c0 + self.kappa * self.n_layers * self.layer(s).sum() + self.per_token * s.sum())

    def params(self) -> dict[str, float]:
        return {"c0": self.c0, "kappa": self.kappa, "per_token": self.per_token, "r2": self.r2}


def nonneg_lstsq(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin |A x - y| over x >= 0 (A [n, k], small k): the best unconstrained fit over the subsets
    of columns whose coefficients all come out >= 0."""
    best, k = (math.inf, np.zeros(A.shape[1])), A.shape[1]
    for size in range(k, 0, -1):
        for cols in itertools.combinations(range(k), size):
            coef, *_ = np.linalg.lstsq(A[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            x = np.zeros(k)
            x[list(cols)] = coef
            loss = float(((A @ x - y) ** 2).sum())
            if loss < best[0]:
                best = (loss, x)
    return best[1]


def fit_step_compute(layer: Callable[[np.ndarray], np.ndarray], n_layers: int,
                     lengths: Sequence[np.ndarray], seconds: Sequence[float]) -> StepCompute:
    """c0, kappa, per_token >= 0 by least squares on relative residuals over measured steps
    (lengths[i]: the sequences of step i, seconds[i]: its compute)."""
    y = np.asarray(seconds, dtype=np.float64)
    if len(lengths) != y.size or y.size < 3 or (y <= 0).any() or n_layers < 1:
        raise ValueError(f"fit_step_compute needs >= 3 steps with seconds > 0 and n_layers >= 1; got "
                         f"{len(lengths)} lengths, {y.size} seconds, n_layers={n_layers}")
    X = np.array([[1.0, n_layers * float(layer(np.asarray(s, dtype=np.float64)).sum()), float(np.sum(s))]
                  for s in lengths])  # [n, 3]
    scale = X.max(0)
    scale[scale == 0] = 1.0
    coef = nonneg_lstsq(X / scale / y[:, None], np.ones_like(y)) / scale
    fitted = X @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - fitted) ** 2).sum()) / total if total > 0 else math.nan
    return StepCompute(float(coef[0]), float(coef[1]), float(coef[2]), n_layers, layer, r2,
                       tuple(float(r) for r in y / fitted - 1))


ADAM_BYTES = 28  # per dense parameter and step: read param, grad, 2 moments; write param, 2 moments (fp32)


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense FLOP/s of the training dtype
    memory_bytes_per_s: float
    source: str


DEVICES: dict[str, Device] = {
    "h100-bf16": Device("h100-bf16", 989.4e12, 3.35e12,
                        "NVIDIA H100 SXM5 datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, 989.4 dense; "
                        "HBM3 3.35 TB/s"),
    "h100-fp32": Device("h100-fp32", 66.9e12, 3.35e12,
                        "NVIDIA H100 SXM5 datasheet: FP32 (non-tensor) 67 TFLOPS; HBM3 3.35 TB/s"),
}


@dataclass(frozen=True)
class Workload:
    """One rank's share of a global batch and what it moves."""

    model: ModelConfig
    users_per_rank: int
    max_len: int
    negatives: int  # the shared pool per batch
    value_bytes: int  # bytes per value of item rows and gradients
    dense_params: int  # all-reduced and stepped by AdamW
    rows_per_token: float  # distinct ids / ids of one rank's lookup (rank de-duplication)

    def __post_init__(self) -> None:
        for name in ("users_per_rank", "max_len", "value_bytes", "dense_params"):
            if getattr(self, name) < 1:
                raise ValueError(f"Workload.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.rows_per_token <= 1 or self.negatives < 0:
            raise ValueError(f"Workload.rows_per_token must be in (0, 1] and negatives >= 0, got "
                             f"{self.rows_per_token}, {self.negatives}")


def padded_flops(lengths: np.ndarray, cfg: ModelConfig, backward: bool = True) -> float:
    """sequence_flops with the causal triangle of each sequence's attention replaced by the full
    square of the batch's longest length M (what a padded dense attention computes)."""
    s = np.asarray(lengths, dtype=np.float64)
    if s.size == 0:
        return 0.0
    N, H = cfg.n_heads, cfg.d_model
    D, mult = H // N, (3.5 if backward else 1.0)
    triangle = cfg.n_layers * mult * 4 * N * D * (s * s / 2).sum()
    square = cfg.n_layers * mult * 4 * N * D * s.size * float(s.max()) ** 2
    return sequence_flops(s, cfg, backward) - triangle + square


def rank_compute(lengths: np.ndarray, wl: Workload, device: Device, efficiency: float, padded: bool) -> np.ndarray:
    """[4] seconds of forward, loss, backward, optimizer for one rank's sequences."""
    flops = padded_flops if padded else sequence_flops
    total, fwd = flops(lengths, wl.model, True), flops(lengths, wl.model, False)
    tokens = int(np.sum(lengths))
    loss_all, loss_fwd = (loss_flops(tokens, wl.negatives, wl.model.d_model, b) for b in (True, False))
    rate = device.peak_flops * efficiency
    optimizer = ADAM_BYTES * wl.dense_params / device.memory_bytes_per_s
    return np.array([fwd / rate, loss_fwd / rate, (total - fwd + loss_all - loss_fwd) / rate, optimizer])


def cluster_loads(pool: np.ndarray, ranks: int, wl: Workload, device: Device, efficiency: float, *,
                  method: str = "kk", padded: bool = False, steps: int = 5, seed: int = 0,
                  plan_s: float = 0.0) -> list[StepLoad]:
    """`steps` global batches of ranks x users_per_rank users drawn from `pool` (with replacement,
    seeded), assigned by `method` on their FLOPs, as StepLoads (plan_s: the host's planning seconds)."""
    pool = np.asarray(pool)
    if pool.ndim != 1 or pool.size == 0 or ranks < 1 or steps < 1:
        raise ValueError(f"cluster_loads needs a non-empty 1-d pool, ranks >= 1 and steps >= 1; got pool "
                         f"{pool.shape}, ranks={ranks}, steps={steps}")
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    rng, cost = np.random.default_rng(seed), FlopsCost(wl.model)
    out = []
    for step in range(steps):
        lengths = np.minimum(rng.choice(pool, ranks * wl.users_per_rank), wl.max_len)  # [P*U]
        owner = assign(cost(lengths), ranks, method, equal_counts=True, seed=seed * 1_000_003 + step)
        compute = np.zeros((4, ranks))
        tokens = np.zeros(ranks)
        for r in range(ranks):
            mine = lengths[owner.rows(r)]
            compute[:, r] = rank_compute(mine, wl, device, efficiency, padded)
            tokens[r] = mine.sum()
        rows = tokens * wl.rows_per_token
        out.append(StepLoad(compute, rows / ranks, (rows + wl.negatives) / ranks, wl.model.d_model * wl.value_bytes,
                            float(wl.dense_params * wl.value_bytes), plan_s, tokens))
    return out
