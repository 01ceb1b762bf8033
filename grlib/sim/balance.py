"""Load imbalance across data-parallel ranks at cluster scale, simulated from a cost model.

One cell is P ranks x U users per rank, sequences truncated at max_len. Each step draws P*U users'
lengths from a pool (with replacement, seeded), models their costs (grlib.distributed.cost), and for each
balancing method (grlib.distributed.balance) assigns them to ranks on the model costs and measures:

    model   imbalance and max_over_mean of the per-rank loads of the model costs
    noisy   the same of the true costs, model * (1 + r), r resampled per sequence from `noise`
            (the relative residuals calibration measured); the balancer still sees the model only

"before" is method "random": the users land on ranks as a shuffling data loader deals them.
`simulate` gives one row per method: the median and p90 over steps of each figure, with the cell.
The per-user lengths of the offline case come from grlib.data.synthetic.user_lengths (the
KuaiRand-27K lognormal fit, median 8646 events).

    pool = user_lengths(100_000, 1.0, np.random.default_rng(0))
    rows = simulate(pool, SimCell(ranks=64, users_per_rank=32, max_len=16384), FlopsCost(cfg))
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from grlib.distributed.balance import METHODS, assign, imbalance, max_over_mean

FIGURES = ("imbalance_model", "max_over_mean_model", "imbalance_noisy", "max_over_mean_noisy")


@dataclass(frozen=True)
class SimCell:
    ranks: int  # P data-parallel ranks
    users_per_rank: int  # U: the global batch is P*U sequences
    max_len: int  # sequences truncated to their last max_len events

    def __post_init__(self) -> None:
        for name in ("ranks", "users_per_rank", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimCell.{name} must be >= 1, got {getattr(self, name)}")


def simulate(lengths_pool: np.ndarray, cell: SimCell, cost: Callable[[np.ndarray], np.ndarray], *,
             methods: Sequence[str] = ("random", "kk", "lpt", "snake"), equal_counts: bool = True,
             steps: int = 20, noise: np.ndarray | None = None, seed: int = 0) -> list[dict]:
    """One row per method: cell fields, method, equal_counts, steps, noisy (bool) and the median and
    p90 over `steps` of each of FIGURES (the noisy ones NaN without `noise`)."""
    pool = np.asarray(lengths_pool)
    if pool.ndim != 1 or pool.size == 0 or (pool < 0).any():
        raise ValueError(f"lengths_pool must be a non-empty one-dimensional array of lengths >= 0, "
                         f"got shape {pool.shape}")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty selection of {', '.join(METHODS)}; got {list(methods)}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if noise is not None:
        noise = np.asarray(noise, dtype=np.float64)
        if noise.ndim != 1 or noise.size == 0 or not np.isfinite(noise).all() or (noise <= -1).any():
            raise ValueError("noise must be a non-empty one-dimensional array of relative residuals > -1")
    rng, noise_rng = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])  # noise leaves the draws alone
    n = cell.ranks * cell.users_per_rank
    figures = {m: {f: [] for f in FIGURES} for m in methods}
    for step in range(steps):
        lengths = np.minimum(rng.choice(pool, n), cell.max_len)  # [n]
        model = np.asarray(cost(lengths), dtype=np.float64)  # [n]
        true = None if noise is None else model * (1.0 + noise_rng.choice(noise, n))  # [n], one draw for all methods
        for m in methods:
            a = assign(model, cell.ranks, m, equal_counts=equal_counts, seed=seed * 1_000_003 + step)
            loads = a.loads(model)
            figures[m]["imbalance_model"].append(imbalance(loads))
            figures[m]["max_over_mean_model"].append(max_over_mean(loads))
            noisy = None if true is None else a.loads(true)
            figures[m]["imbalance_noisy"].append(np.nan if noisy is None else imbalance(noisy))
            figures[m]["max_over_mean_noisy"].append(np.nan if noisy is None else max_over_mean(noisy))
    rows = []
    for m in methods:
        row = {**asdict(cell), "method": m, "equal_counts": equal_counts, "steps": steps, "noisy": noise is not None}
        for f, values in figures[m].items():
            row[f"{f}_median"] = float(np.median(values))
            row[f"{f}_p90"] = float(np.quantile(values, 0.9))
        rows.append(row)
    return rows


def grid(lengths_pool: np.ndarray, cost: Callable[[np.ndarray], np.ndarray], *,
         ranks: Sequence[int] = (8, 64, 512, 1536), users: Sequence[int] = (4, 8, 32),
         max_lens: Sequence[int] = (4096, 16384), steps: int = 20, sequence_budget: int | None = None,
         **kw) -> list[dict]:
    """simulate over every cell of ranks x users x max_lens. With `sequence_budget`, a cell runs
    min(steps, max(3, sequence_budget // (ranks * users))) steps, so big cells take fewer (each
    row says its steps); **kw goes to simulate (methods, equal_counts, noise, seed)."""
    rows = []
    for p in ranks:
        for u in users:
            for max_len in max_lens:
                n = steps if sequence_budget is None else min(steps, max(3, sequence_budget // (p * u)))
                rows += simulate(lengths_pool, SimCell(p, u, max_len), cost, steps=n, **kw)
    return rows
