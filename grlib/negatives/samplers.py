"""Negative samplers: which item ids the tokens of a batch are contrasted with, and with what
probability Q(item) each id is drawn (for the logQ correction).

    uniform     Q(j) = 1 / (V - 2) over the real items (ids 2..V-1; 0 = pad and 1 = OOV never drawn)
    popularity  Q(j) = (c_j + 1) / sum(c + 1), c = training target counts (add-one smoothing, so every
                item can be drawn and log Q is finite)
    in-batch    ids drawn uniformly from the batch's own targets: Q(j) is the target marginal
                c_j / sum(c) (c_j clipped at 1 so that log Q stays finite)

Every sampler draws with replacement, which keeps sum_k exp(s_k - log Q_k) / R an unbiased estimate
of the partition function (the basis of the logQ correction, Bengio & Senecal 2008; Yi et al. 2019).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from grlib.data.schema import FIRST_ITEM_ID


class Sampler:
    """Draws item ids; `log_q` gives log Q per id (None when Q is uniform: the correction cancels)."""

    name = "base"

    def __init__(self, n_items: int):
        if n_items <= FIRST_ITEM_ID:
            raise ValueError(f"n_items={n_items}: the vocabulary holds no real item (ids start at {FIRST_ITEM_ID})")
        self.n_items = n_items

    def draw(self, shape: tuple[int, ...], targets: Tensor, generator: torch.Generator) -> Tensor:
        """Ids of `shape` (int64). targets [P]: the batch's target ids (used by in-batch)."""
        raise NotImplementedError

    def log_q(self) -> Tensor | None:
        """[n_items] fp32 log Q, or None when Q is uniform over the items (the correction cancels)."""
        return None

    def probabilities(self, targets: Tensor | None = None) -> Tensor:
        """[n_items] float64 Q over the vocabulary (for tests and reports)."""
        raise NotImplementedError


class UniformSampler(Sampler):
    name = "uniform"

    def draw(self, shape, targets, generator):
        return torch.randint(FIRST_ITEM_ID, self.n_items, shape, generator=generator)

    def probabilities(self, targets=None):
        q = torch.zeros(self.n_items, dtype=torch.float64)
        q[FIRST_ITEM_ID:] = 1.0 / (self.n_items - FIRST_ITEM_ID)
        return q


def _counts(item_counts: np.ndarray | None, n_items: int, who: str) -> Tensor:
    if item_counts is None:
        raise ValueError(f"negatives.sampler={who!r} needs item_counts (training target counts per item)")
    counts = torch.as_tensor(np.asarray(item_counts), dtype=torch.float64)
    if counts.shape != (n_items,):
        raise ValueError(f"negatives.sampler={who!r}: item_counts has shape {tuple(counts.shape)}, "
                         f"expected ({n_items},)")
    if (counts < 0).any():
        raise ValueError(f"negatives.sampler={who!r}: item_counts holds negative counts")
    counts[:FIRST_ITEM_ID] = 0
    return counts


class PopularitySampler(Sampler):
    name = "popularity"

    def __init__(self, n_items: int, item_counts: np.ndarray | None):
        super().__init__(n_items)
        smoothed = _counts(item_counts, n_items, self.name) + 1.0
        smoothed[:FIRST_ITEM_ID] = 0
        self.q = smoothed / smoothed.sum()  # [V] float64
        self.cdf = torch.cumsum(self.q, 0)  # [V]
        self.cdf /= self.cdf[-1].clone()
        self.logq = torch.log(self.q).float()  # [V] (-inf for pad / OOV, never drawn)

    def draw(self, shape, targets, generator):
        u = torch.rand(shape, generator=generator, dtype=torch.float64)
        ids = torch.searchsorted(self.cdf, u, right=True)  # first index with cdf > u
        return ids.clamp_(FIRST_ITEM_ID, self.n_items - 1)

    def log_q(self):
        return self.logq

    def probabilities(self, targets=None):
        return self.q.clone()


class InBatchSampler(Sampler):
    """Negatives are other tokens' targets from the same batch (drawn uniformly from them)."""

    name = "in-batch"

    def __init__(self, n_items: int, item_counts: np.ndarray | None):
        super().__init__(n_items)
        counts = _counts(item_counts, n_items, self.name).clamp_(min=1.0)
        counts[:FIRST_ITEM_ID] = 0
        self.logq = torch.log(counts / counts.sum()).float()  # [V]

    def draw(self, shape, targets, generator):
        if targets.numel() == 0:
            return torch.full(shape, FIRST_ITEM_ID, dtype=torch.int64)  # no token will score them
        pick = torch.randint(0, targets.numel(), shape, generator=generator)
        return targets[pick]

    def pool(self, targets: Tensor, size: int, generator: torch.Generator) -> Tensor:
        """The shared pool: every target of the batch when P <= size, else `size` of them (no replacement)."""
        if targets.numel() <= size:
            return targets.clone()
        return targets[torch.randperm(targets.numel(), generator=generator)[:size]]

    def log_q(self):
        return self.logq

    def probabilities(self, targets=None):
        if targets is None:
            q = self.logq.double().exp()
            q[:FIRST_ITEM_ID] = 0
            return q
        q = torch.bincount(targets, minlength=self.n_items).double()
        return q / q.sum()


def build_sampler(name: str, n_items: int, item_counts: np.ndarray | None) -> Sampler:
    if name == "uniform":
        return UniformSampler(n_items)
    if name == "popularity":
        return PopularitySampler(n_items, item_counts)
    if name == "in-batch":
        return InBatchSampler(n_items, item_counts)
    raise ValueError(f"negatives.sampler={name!r} is not one of ('uniform', 'popularity', 'in-batch')")


def chi_square_pvalue(observed: Tensor, expected_p: Tensor) -> float:
    """Pearson's chi-square goodness-of-fit p-value of counts `observed` against probabilities
    `expected_p` (cells with p = 0 must be empty; they are left out of the statistic)."""
    observed, expected_p = observed.double(), expected_p.double()
    support = expected_p > 0
    if observed[~support].sum() > 0:
        return 0.0
    n = observed.sum()
    expected = expected_p[support] / expected_p[support].sum() * n
    stat = ((observed[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0)) if df > 0 \
        else float(math.isclose(float(stat), 0.0))
