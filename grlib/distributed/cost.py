"""The cost of one sequence for the balancer (grlib.distributed.balance): modelled from its length.

    QuadraticCost     seconds(s) = c0 + a*s + b*s^2, fitted to measured times (fit_quadratic)
    FlopsCost         grlib.perf.sequence_flops of one sequence of length s (FLOPs, not seconds)
    calibrate_layer   times one HSTU layer, forward + backward, per sequence at given lengths

An HSTU layer's time is linear in s (projections, norms, elementwise) plus quadratic (the causal
attention), so a quadratic in s fits it; the fit is weighted so that relative errors count alike
at every length (a short sequence's 1 ms matters as much as a long one's 1 s), and its coefficients
are kept non-negative (a negative one would give negative or decreasing costs at some length).
The relative residuals of the calibration points (measured / fitted - 1) are kept with the fit:
grlib.sim.balance resamples them as the noise between the model the balancer sees and the truth.

    rows = calibrate_layer(ModelConfig(name="hstu", n_heads=2, d_model=128), [16, 32, ..., 4096])
    cost = fit_quadratic([r["length"] for r in rows], [r["seconds_per_sequence"] for r in rows])
    cost(np.array([100, 8000]))   # [2] seconds;  cost.params() -> {"c0": ..., "a": ..., "b": ..., "r2": ...}
"""
from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from grlib.config import ModelConfig
from grlib.jagged import JaggedBatch
from grlib.model.hstu import HSTULayer
from grlib.perf import sequence_flops

TERMS = ("c0", "a", "b")  # coefficients of 1, s, s^2


@dataclass(frozen=True)
class QuadraticCost:
    """seconds(s) = c0 + a*s + b*s^2 per sequence of length s."""

    c0: float
    a: float
    b: float
    r2: float = float("nan")  # of the fit, on the measured seconds (NaN when they do not vary)
    residuals: tuple[float, ...] = ()  # measured / fitted - 1 at each calibration point

    def __call__(self, lengths) -> np.ndarray:  # [B] -> [B] float64 seconds
        s = np.asarray(lengths, dtype=np.float64)
        return self.c0 + self.a * s + self.b * s * s

    def params(self) -> dict[str, float]:
        return {"c0": self.c0, "a": self.a, "b": self.b, "r2": self.r2}


def fit_quadratic(lengths, seconds) -> QuadraticCost:
    """Least squares of seconds on (1, s, s^2), weights 1/seconds, coefficients >= 0.

    The non-negative optimum is the best fit among the unconstrained fits of every subset of the
    terms whose coefficients all come out >= 0 (the full fit when it has none negative)."""
    s = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if s.ndim != 1 or y.shape != s.shape:
        raise ValueError(f"lengths and seconds must be one-dimensional of the same shape, got {s.shape} and {y.shape}")
    if not (np.isfinite(s).all() and np.isfinite(y).all()) or (s < 0).any() or (y <= 0).any():
        raise ValueError("lengths must be finite and >= 0, seconds finite and > 0")
    if len(np.unique(s)) < 3:
        raise ValueError(f"fit_quadratic needs at least 3 distinct lengths, got {len(np.unique(s))}")
    scale = max(float(s.max()), 1.0)  # columns in [0, 1]: s / scale, (s / scale)^2
    design = np.stack([np.ones_like(s), s / scale, (s / scale) ** 2], axis=1) / y[:, None]  # [n, 3] weighted
    best: tuple[float, np.ndarray] | None = None
    for k in (3, 2, 1):
        for terms in itertools.combinations(range(3), k):
            coef, *_ = np.linalg.lstsq(design[:, terms], np.ones_like(y), rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(3)
            full[list(terms)] = coef
            loss = float(((design @ full - 1.0) ** 2).sum())
            if best is None or loss < best[0] - 1e-12 * max(best[0], 1e-300):
                best = (loss, full)
    assert best is not None  # a single term with positive data always fits with a coefficient > 0
    c0, a, b = best[1] / np.array([1.0, scale, scale * scale])
    fitted = c0 + a * s + b * s * s
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - fitted) ** 2).sum()) / total if np.ptp(y) > 0 else float("nan")
    return QuadraticCost(c0=float(c0), a=float(a), b=float(b), r2=r2,
                         residuals=tuple(float(r) for r in y / fitted - 1.0))


@dataclass(frozen=True)
class FlopsCost:
    """Training FLOPs of one sequence of length s under `model` (grlib.perf.sequence_flops).

    sequence_flops is a quadratic in s per sequence; its three coefficients are read from it once
    (at s = 0, 1, 2) and checked at s = 3 and 1000, so a change to that formula that is no longer a
    quadratic raises here instead of giving wrong costs."""

    model: ModelConfig

    def __post_init__(self) -> None:
        f = [sequence_flops(np.array([s]), self.model) for s in (0, 1, 2)]
        c0, b = f[0], (f[2] - 2 * f[1] + f[0]) / 2
        object.__setattr__(self, "_coef", (c0, f[1] - f[0] - b, b))
        for s in (3, 1000):
            want = sequence_flops(np.array([s]), self.model)
            if not math.isclose(float(self(np.array([s]))[0]), want, rel_tol=1e-9):
                raise ValueError(f"grlib.perf.sequence_flops is not a quadratic in the length for {self.model}")

    def __call__(self, lengths) -> np.ndarray:  # [B] -> [B] float64 FLOPs
        c0, a, b = self._coef
        s = np.asarray(lengths, dtype=np.float64)
        return c0 + a * s + b * s * s

    def params(self) -> dict:
        c0, a, b = self._coef
        return {"model": self.model.name, "n_layers": self.model.n_layers, "n_heads": self.model.n_heads,
                "d_model": self.model.d_model, "c0": c0, "a": a, "b": b}


def calibrate_layer(model: ModelConfig, lengths: Sequence[int], *, repeats: int = 5, min_seconds: float = 0.05,
                    seed: int = 0) -> list[dict]:
    """Seconds per sequence of one HSTU layer's forward + backward at each length, on one thread.

    At length s the batch is k sequences of s tokens, k >= 1 the fewest for one run to take at
    least `min_seconds` (found after a warm-up run). The `repeats` timed runs go in rounds over all
    the lengths, so the runs of one length are spread over the whole calibration: a burst of other
    work on a shared machine lands on one round of some lengths, not on every run of one length,
    and the median drops it. The time is that median, over k.
    Returns one row per length: length, sequences (k), seconds_per_sequence, repeats."""
    if model.name != "hstu":
        raise ValueError(f"calibrate_layer times an HSTU layer; model.name must be 'hstu', got {model.name!r}")
    if repeats < 1 or min_seconds < 0:
        raise ValueError(f"repeats must be >= 1 and min_seconds >= 0, got {repeats} and {min_seconds}")
    if any(int(s) < 1 for s in lengths):
        raise ValueError(f"lengths must all be >= 1, got {list(lengths)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            layer = HSTULayer(model.d_model, model.n_heads, model.dropout, model.attention_impl).train()
            lengths = [int(s) for s in lengths]
            ks = []
            for s in lengths:
                _run(layer, model.d_model, s, 1)  # warm: a length's first run is slower
                once, _ = _run(layer, model.d_model, s, 1)
                ks.append(max(1, math.ceil(min_seconds / max(once, 1e-9))))
                _run(layer, model.d_model, s, ks[-1])  # warm at the batch the rounds time
            times: list[list[tuple[float, float]]] = [[] for _ in lengths]  # [length][round] (on-CPU, wall)
            for _ in range(repeats):
                for i, (s, k) in enumerate(zip(lengths, ks)):
                    times[i].append(_run(layer, model.d_model, s, k))
    finally:
        torch.set_num_threads(threads)
    rows = []
    for s, k, runs in zip(lengths, ks, times):
        on_cpu = statistics.median(t for t, _ in runs)
        wall = statistics.median(w for _, w in runs)
        rows.append({"length": s, "sequences": k, "repeats": repeats, "seconds_per_sequence": on_cpu / k,
                     "wall_seconds_per_sequence": wall / k})
    return rows


def layer_batch(lengths: Sequence[int]) -> JaggedBatch:
    """Sequences of `lengths` (ids and actions zero: the layer reads offsets and timestamps only)."""
    lengths = [int(n) for n in lengths]
    T = sum(lengths)
    zeros = torch.zeros(T, dtype=torch.int64)
    timestamps = torch.cumsum(torch.randint(1, 5000, (T,)), 0)  # [T] seconds, increasing
    offsets = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)  # [B+1]
    return JaggedBatch(item_ids=zeros, actions=zeros, timestamps=timestamps, offsets=offsets,
                       max_len=max(lengths, default=1), targets=zeros)


def time_pass(layer: HSTULayer, lengths: Sequence[int], repeats: int = 1) -> tuple[float, float]:
    """(on-CPU, wall) median seconds of `repeats` forward + backward passes of `layer` over one
    jagged batch of sequences of `lengths` (see _run for on-CPU time)."""
    return _timed(layer, layer_batch(lengths), repeats)


def _run(layer: HSTULayer, d: int, s: int, k: int, repeats: int = 1) -> tuple[float, float]:
    """(on-CPU, wall) median seconds of `repeats` forward + backward passes over k sequences of length s.

    On one thread a pass runs in this process alone, so its on-CPU time, min(wall, process CPU
    time), is its time on a core of its own: other jobs sharing the cores lengthen the wall time
    only (as grlib.perf.measure_peak_flops times its GEMMs)."""
    return _timed(layer, layer_batch([s] * k), repeats)


def _timed(layer: HSTULayer, batch: JaggedBatch, repeats: int) -> tuple[float, float]:
    d = layer.out.in_features
    x = torch.randn(batch.num_tokens, d, requires_grad=True)  # [T, d]
    grad = torch.randn(batch.num_tokens, d)  # [T, d]
    on_cpu, walls = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        layer(x, batch).backward(grad)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        on_cpu.append(min(wall, cpu))
        walls.append(wall)
        layer.zero_grad(set_to_none=True)
        x.grad = None
    return statistics.median(on_cpu), statistics.median(walls)
