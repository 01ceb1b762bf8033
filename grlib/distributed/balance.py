"""Dynamic load balancing of a jagged batch across P data-parallel ranks (pure numpy, deterministic).

Each of the B sequences of a global batch has a cost (grlib.distributed.cost: modelled seconds or FLOPs);
`assign` gives every sequence an owner rank so that the per-rank loads are even. Methods:

    none        no balancing: ranks take consecutive sequences, the first B % P one more (JaggedBatch.split(P))
    random      a seeded permutation, then contiguous chunks: users as a shuffling loader deals them
    snake       sort by cost descending, deal 0..P-1, P-1..0, 0..P-1, ... (boustrophedon)
    lpt         longest processing time first: sort descending, each to the least-loaded rank
    kk          Karmarkar-Karp largest differencing for P-way partitions

equal_counts=True (the default) keeps every rank's count at floor(B/P) or ceil(B/P), as the
data-parallel step needs equal-sized micro-batches: lpt skips a rank that is full (at most B % P
ranks may hold ceil(B/P)); kk runs the balanced variant (sequences sorted, padded with zero-cost
dummies to a multiple of P, dealt in groups of P so that every partial solution's subsets hold
the same number of sequences; the dummies of the last group land on distinct ranks and are
dropped). equal_counts=False frees the counts of lpt and kk; none, random and snake always
give floor/ceil counts (their definition), whatever the flag.

Determinism: stable sorts (ties by sequence index), heaps keyed (load, rank) or (-spread, id):
the same costs give the same owner array on every process, so each rank can compute the plan alone.

Guarantees (what the tests hold): unconstrained lpt's max load <= mean load + max cost (the
busiest rank's last sequence went to the least-loaded rank, at most the mean) and <= (4/3 - 1/(3P))
* optimum (Graham). With equal counts the first bound held on every case tried (exhaustive small
cases, random search) but is not proven here. kk is usually better than lpt but not always (with
few sequences per rank the balanced kk loses to lpt), and no method beats the random deal on every
instance (one dominant sequence can tie them all).

Figures of imbalance: `imbalance` = (max - min) / max (NVIDIA recsys-examples' definition) and
`max_over_mean` = max / mean (step time over the ideal; 1 - mean/max is the throughput lost to
waiting at the gradient all-reduce).
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from grlib.config import choices

METHODS = choices.BALANCERS  # ("none", "random", "snake", "lpt", "kk"): the names of dist.balance and --balance


@dataclass(frozen=True)
class Assignment:
    """The owner rank of each of B sequences."""

    owner: np.ndarray  # [B] int64 in [0, ranks)
    ranks: int

    def rows(self, rank: int) -> np.ndarray:  # [B_r] int64 ascending
        """The sequences of `rank`, in batch order (to pass to JaggedBatch.select)."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank must be in [0, {self.ranks}), got {rank}")
        return np.flatnonzero(self.owner == rank).astype(np.int64)

    def counts(self) -> np.ndarray:  # [P] int64
        return np.bincount(self.owner, minlength=self.ranks).astype(np.int64)

    def loads(self, costs: np.ndarray) -> np.ndarray:  # [P] float64
        """The sum of `costs` [B] over each rank's sequences."""
        costs = np.asarray(costs, dtype=np.float64)
        if costs.shape != self.owner.shape:
            raise ValueError(f"costs must have shape {self.owner.shape} (one per sequence), got {costs.shape}")
        return np.bincount(self.owner, weights=costs, minlength=self.ranks).astype(np.float64)


def imbalance(loads: np.ndarray) -> float:
    """(max - min) / max of per-rank loads [P]; 0 when max == 0."""
    loads = _loads(loads)
    top = float(loads.max())
    return 0.0 if top == 0 else (top - float(loads.min())) / top


def max_over_mean(loads: np.ndarray) -> float:
    """max / mean of per-rank loads [P] (the step time over the ideal); 1 when mean == 0."""
    loads = _loads(loads)
    mean = float(loads.mean())
    return 1.0 if mean == 0 else float(loads.max()) / mean


def assign(costs: np.ndarray, ranks: int, method: str, *, equal_counts: bool = True, seed: int = 0) -> Assignment:
    """The owner rank of each sequence of cost `costs` [B] (>= 0, finite) among `ranks` ranks."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    costs = np.asarray(costs, dtype=np.float64)
    if costs.ndim != 1:
        raise ValueError(f"costs must be one-dimensional [B], got shape {costs.shape}")
    if not np.isfinite(costs).all() or (costs < 0).any():
        raise ValueError("costs must be finite and >= 0 (one per sequence)")
    ranks = int(ranks)
    if method == "none":
        owner = _contiguous(len(costs), ranks)
    elif method == "random":
        owner = np.empty(len(costs), dtype=np.int64)
        owner[np.random.default_rng(seed).permutation(len(costs))] = _contiguous(len(costs), ranks)
    elif method == "snake":
        owner = _snake(costs, ranks)
    elif method == "lpt":
        owner = _lpt(costs, ranks, equal_counts)
    else:
        owner = _kk(costs, ranks, equal_counts)
    return Assignment(owner=owner, ranks=ranks)


def _loads(loads: np.ndarray) -> np.ndarray:
    loads = np.asarray(loads, dtype=np.float64)
    if loads.ndim != 1 or loads.size == 0:
        raise ValueError(f"loads must be one-dimensional [P] with P >= 1, got shape {loads.shape}")
    return loads


def _descending(costs: np.ndarray) -> np.ndarray:  # [B] sequence indices, largest cost first, ties by index
    return np.argsort(-costs, kind="stable")


def _contiguous(n: int, ranks: int) -> np.ndarray:  # [n] int64: JaggedBatch.split(ranks)'s boundaries
    size, extra = divmod(n, ranks)
    return np.repeat(np.arange(ranks, dtype=np.int64), size + (np.arange(ranks) < extra))


def _snake(costs: np.ndarray, ranks: int) -> np.ndarray:
    position = np.arange(len(costs))
    turn, k = np.divmod(position, ranks)
    owner = np.empty(len(costs), dtype=np.int64)
    owner[_descending(costs)] = np.where(turn % 2 == 0, k, ranks - 1 - k)
    return owner


def _lpt(costs: np.ndarray, ranks: int, equal_counts: bool) -> np.ndarray:
    size, extra = divmod(len(costs), ranks)
    owner = np.empty(len(costs), dtype=np.int64)
    count = [0] * ranks
    heap = [(0.0, r) for r in range(ranks)]  # (load, rank): least load first, ties by rank
    big_left = extra  # ranks that may still reach size + 1 sequences
    for i in _descending(costs).tolist():
        while True:
            load, r = heap[0]
            if not equal_counts or count[r] < size or (count[r] == size and big_left > 0):
                break
            heapq.heappop(heap)  # full for good: counts only grow and big_left only falls
        owner[i] = r
        count[r] += 1
        if equal_counts and count[r] == size + 1:
            big_left -= 1
        heapq.heapreplace(heap, (load + float(costs[i]), r))
    return owner


def _kk(costs: np.ndarray, ranks: int, equal_counts: bool) -> np.ndarray:
    """Largest differencing: a partial solution is P subset sums [P] (descending) with a label per
    subset (a sequence index; -1 for an empty subset). Merging the two of largest spread pairs the
    largest subset of one with the smallest of the other and links the second's labels under the
    first's (a union-find over sequence indices, resolved at the end)."""
    n = len(costs)
    order = _descending(costs).tolist()
    parent = np.arange(n + (-n) % ranks, dtype=np.int64)  # label -> the label its subset was merged into
    ids = itertools.count()
    if equal_counts:  # groups of P consecutive sequences in cost order; zero-cost dummies (index >= n) last
        padded = np.array(order + list(range(n, len(parent))), dtype=np.int64)
        weight = np.concatenate([costs, np.zeros(len(parent) - n)])
        heap = [(-(weight[g[0]] - weight[g[-1]]), next(ids), (weight[g], g))
                for g in np.split(padded, len(padded) // ranks)] if len(padded) else []
    else:  # every sequence alone: [cost, 0, ..., 0], kept as its index until merged
        heap = [(-float(costs[i]), next(ids), i) for i in order]
    heapq.heapify(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        if isinstance(b, int) or isinstance(a, int):  # a lone sequence joins the other's smallest subset
            i, other = (b, a) if isinstance(b, int) else (a, b)
            sums, labels = _materialise(other, costs, ranks) if isinstance(other, int) else other
            value, label = sums[-1] + costs[i], labels[-1]
            if label >= 0:
                parent[i] = label
            else:
                label = i
            at = int(np.searchsorted(-sums[:-1], -value, side="right"))
            sums = np.concatenate([sums[:at], [value], sums[at:-1]])
            labels = np.concatenate([labels[:at], [label], labels[at:-1]])
        else:
            (s1, l1), (s2, l2) = a, (b[0][::-1], b[1][::-1])  # the other's smallest beside this one's largest
            both = (l1 >= 0) & (l2 >= 0)
            parent[l2[both]] = l1[both]
            sums, labels = s1 + s2, np.where(l1 >= 0, l1, l2)
            resort = np.argsort(-sums, kind="stable")
            sums, labels = sums[resort], labels[resort]
        heapq.heappush(heap, (-(sums[0] - sums[-1]), next(ids), (sums, labels)))
    while True:  # every label to its root
        up = parent[parent]
        if np.array_equal(up, parent):
            break
        parent = up
    rank_of = np.full(len(parent), -1, dtype=np.int64)
    if heap:
        _, _, last = heap[0]
        labels = _materialise(last, costs, ranks)[1] if isinstance(last, int) else last[1]
        rank_of[labels[labels >= 0]] = np.flatnonzero(labels >= 0)
    return rank_of[parent[:n]]


def _materialise(i: int, costs: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """The partial solution of sequence i alone: sums [cost, 0, ...] [P], labels [i, -1, ...] [P]."""
    sums, labels = np.zeros(ranks), np.full(ranks, -1, dtype=np.int64)
    sums[0], labels[0] = costs[i], i
    return sums, labels
