"""Measuring helpers the stages and the benchmarks share: median wall time of repeats, and
KuaiRand-like per-user lengths for kernel inputs."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import numpy as np

from grlib.data.synthetic import LENGTH_MAX, LENGTH_MEDIAN, LENGTH_MIN, LENGTH_SIGMA

Z99 = 2.3263478740408408  # standard normal 0.99 quantile


def median_ms(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of fn() in milliseconds over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kuairand_lengths(n: int, max_len: int, regime: str, seed: int = 0) -> np.ndarray:
    """n per-user lengths from the lognormal fit to KuaiRand-27K's published quantiles.

    regime 'truncated': the real lengths cut at max_len (nearly all full when max_len <= 4096);
    regime 'scaled': the distribution scaled so that its p99 equals max_len (real raggedness,
    smaller size), cut at max_len."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(math.log(LENGTH_MEDIAN), LENGTH_SIGMA, n).clip(LENGTH_MIN, LENGTH_MAX)
    if regime == "scaled":
        p99 = LENGTH_MEDIAN * math.exp(LENGTH_SIGMA * Z99)
        raw = raw * (max_len / p99)
    elif regime != "truncated":
        raise ValueError(f"regime must be 'truncated' or 'scaled', got {regime!r}")
    return np.clip(np.round(raw), 1, max_len).astype(np.int64)
