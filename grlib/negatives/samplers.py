"""Negative samplers: which item ids the tokens of a batch are contrasted with, and with what
probability Q(item) each id is drawn (for the logQ correction).

    uniform     Q(j) = 1 / (V - 2) over the real items (ids 2..V-1; 0 = pad and 1 = OOV never drawn)
    popularity  Q(j) = (c_j + 1) / sum(c + 1), c = training target counts (add-one smoothing, so every
                item can be drawn and log Q is finite); drawn in O(1) per id from a Walker alias
                table with numpy (single-threaded, the GIL released), so a background worker does
                not start an OpenMP team of its own next to the training threads
    in-batch    ids drawn uniformly from the batch's own targets: Q(j) is the target marginal
                c_j / sum(c) (c_j clipped at 1 so that log Q stays finite)

Every draw is made with numpy (a numpy Generator seeded from the caller's torch.Generator, so runs
are reproducible): numpy runs single-threaded with the GIL released, while a torch op run in the
async worker thread starts an OpenMP team of its own, and the two extra spinning threads then slow
every parallel region of the training threads (libgomp throttles its spin once it manages more
threads than there are cores).

Every sampler draws with replacement, which keeps sum_k exp(s_k - log Q_k) / R an unbiased estimate
of the partition function (the basis of the logQ correction, Bengio & Senecal 2008; Yi et al. 2019).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from grlib.schema import FIRST_ITEM_ID


class Sampler:
    """Draws item ids; `log_q` gives log Q per id (None when Q is uniform: the correction cancels)."""

    name = "base"

    def __init__(self, n_items: int):
        if n_items <= FIRST_ITEM_ID:
            raise ValueError(f"n_items={n_items}: the vocabulary holds no real item (ids start at {FIRST_ITEM_ID})")
        self.n_items = n_items

    def draw(self, shape: tuple[int, ...], targets: Tensor, generator: torch.Generator,
             dtype: torch.dtype = torch.int64) -> Tensor:
        """Ids of `shape` and `dtype` (int64, or int32 when n_items < 2**31). targets [P]: the
        batch's target ids (used by in-batch)."""
        raise NotImplementedError

    def log_q(self) -> Tensor | None:
        """[n_items] fp32 log Q, or None when Q is uniform over the items (the correction cancels)."""
        return None

    def probabilities(self, targets: Tensor | None = None) -> Tensor:
        """[n_items] float64 Q over the vocabulary (for tests and reports)."""
        raise NotImplementedError


NP_DTYPES = {torch.int32: np.int32, torch.int64: np.int64}


def numpy_rng(generator: torch.Generator) -> np.random.Generator:
    """A numpy Generator seeded by one draw of the torch generator (a scalar op: no OpenMP team)."""
    return np.random.default_rng(int(torch.randint(0, 2**62, (), generator=generator)))


def _np_dtype(dtype: torch.dtype, n_items: int) -> type:
    if dtype not in NP_DTYPES or (dtype == torch.int32 and n_items >= 2**31):
        raise ValueError(f"sampler dtype {dtype} cannot hold ids below {n_items}")
    return NP_DTYPES[dtype]


class UniformSampler(Sampler):
    name = "uniform"

    def draw(self, shape, targets, generator, dtype=torch.int64):
        ids = numpy_rng(generator).integers(FIRST_ITEM_ID, self.n_items, shape, dtype=_np_dtype(dtype, self.n_items))
        return torch.from_numpy(ids)

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


def alias_table(q: np.ndarray, max_rounds: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of the distribution q [n] (float64, sums to 1): (prob [n] float64,
    alias [n] int64) such that drawing k uniformly, then k with probability prob[k] else alias[k],
    draws i with probability q[i] exactly (up to float rounding; see alias_probabilities).

    Vose's pairing, vectorised: in each round every small bucket (mass < 1) takes the large bucket
    (mass >= 1) whose excess interval holds the start of its deficit on the cumulative axis, so a
    large one can fill many small ones in one round and keeps a mass >= 0. The few leftovers after
    `max_rounds` rounds are paired one by one."""
    n = len(q)
    prob = np.asarray(q, dtype=np.float64) * n  # [n] bucket masses, mean 1
    alias = np.arange(n, dtype=np.int64)
    small, large = np.flatnonzero(prob < 1.0), np.flatnonzero(prob >= 1.0)
    for _ in range(max_rounds):
        if small.size == 0 or large.size == 0:
            break
        excess_end = np.cumsum(prob[large] - 1.0)  # [L] inclusive ends of the excess intervals
        deficit_start = np.cumsum(1.0 - prob[small]) - (1.0 - prob[small])  # [S] exclusive starts
        j = np.searchsorted(excess_end, deficit_start, side="right")  # [S] large whose interval holds it
        done = j < large.size
        s_done, giver = small[done], large[j[done]]
        alias[s_done] = giver
        np.subtract.at(prob, giver, 1.0 - prob[s_done])
        touched = np.unique(giver)
        small = np.concatenate([small[~done], touched[prob[touched] < 1.0]])
        large = np.concatenate([np.setdiff1d(large, touched, assume_unique=True), touched[prob[touched] >= 1.0]])
    small_l, large_l = small.tolist(), large.tolist()
    while small_l and large_l:  # the rare leftovers: Vose's loop
        s_i, l_i = small_l.pop(), large_l[-1]
        alias[s_i] = l_i
        prob[l_i] -= 1.0 - prob[s_i]
        if prob[l_i] < 1.0:
            small_l.append(large_l.pop())
    prob[small_l + large_l] = 1.0  # float rounding only: their mass is 1 up to ~1e-12
    prob = np.clip(prob, 0.0, 1.0)
    never = np.asarray(q) == 0  # ids with Q = 0 (zero-mass buckets come first, so round 1 pairs them)
    if (prob[never] > 0).any() or never[alias[prob < 1.0]].any():
        raise RuntimeError("alias_table: an id of probability 0 could be drawn (float rounding)")
    return prob, alias


def alias_probabilities(prob: np.ndarray, alias: np.ndarray) -> np.ndarray:
    """[n] the distribution an alias table draws (for tests)."""
    n = len(prob)
    return (prob + np.bincount(alias, weights=1.0 - prob, minlength=n)) / n


class PopularitySampler(Sampler):
    name = "popularity"

    def __init__(self, n_items: int, item_counts: np.ndarray | None):
        super().__init__(n_items)
        smoothed = _counts(item_counts, n_items, self.name) + 1.0
        smoothed[:FIRST_ITEM_ID] = 0
        self.q = smoothed / smoothed.sum()  # [V] float64
        self.logq = torch.log(self.q).float()  # [V] (-inf for pad / OOV, never drawn)
        self.prob, alias = alias_table(self.q.numpy())  # [V] float64, [V] int64
        self.alias = {np.int64: alias}  # per id dtype, so a draw indexes without a conversion
        if n_items < 2**31:
            self.alias[np.int32] = alias.astype(np.int32)

    def draw(self, shape, targets, generator, dtype=torch.int64):
        nd = _np_dtype(dtype, self.n_items)
        u = numpy_rng(generator).random(shape) * self.n_items  # [shape] in [0, V)
        k = np.minimum(u.astype(nd), self.n_items - 1)  # bucket
        np.subtract(u, k, out=u)  # [shape] uniform in [0, 1): the coin
        return torch.from_numpy(np.where(u < self.prob[k], k, self.alias[nd][k]))

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

    def draw(self, shape, targets, generator, dtype=torch.int64):
        nd = _np_dtype(dtype, self.n_items)
        t = targets.numpy()  # [P] (CPU)
        if t.size == 0:
            return torch.from_numpy(np.full(shape, FIRST_ITEM_ID, dtype=nd))  # no token will score them
        return torch.from_numpy(t[numpy_rng(generator).integers(0, t.size, shape)].astype(nd))

    def pool(self, targets: Tensor, size: int, generator: torch.Generator) -> Tensor:
        """The shared pool: every target of the batch when P <= size, else `size` of them (no replacement)."""
        t = targets.numpy()  # [P]
        if t.size <= size:
            return torch.from_numpy(t.copy())
        return torch.from_numpy(t[numpy_rng(generator).permutation(t.size)[:size]])

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
