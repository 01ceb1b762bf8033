"""Measuring helpers the stages and the benchmarks share: median wall time of repeats, and
KuaiRand-like per-user lengths for kernel inputs (grlib.data.synthetic.kuairand_lengths, re-exported)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from grlib.data.synthetic import kuairand_lengths  # noqa: F401  (the length model lives with the data's)


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
