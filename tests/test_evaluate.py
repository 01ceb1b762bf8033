"""Full-ranking metrics agree with a brute-force per-user computation."""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib.data.schema import FIRST_ITEM_ID
from grlib.evaluate import metrics_from_ranks, ranks_from_scores


def brute_force_rank(scores: list[float], target: int, history: set[int]) -> int:
    t = scores[target]
    rank = 1
    for item, s in enumerate(scores):
        if item == target or item < FIRST_ITEM_ID or item in history:
            continue
        if s >= t:  # ties count against the target
            rank += 1
    return rank


@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.integers(FIRST_ITEM_ID + 1, 40), st.booleans())
def test_ranks_match_brute_force(seed, B, V, ties):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, (B, V)).astype(np.float32) if ties else rng.standard_normal((B, V)).astype(np.float32)
    targets = rng.integers(FIRST_ITEM_ID, V, B)
    history = [rng.integers(0, V, rng.integers(0, 5)) for _ in range(B)]
    ranks = ranks_from_scores(torch.from_numpy(scores), torch.from_numpy(targets), history)
    expect = [brute_force_rank(scores[b].tolist(), int(targets[b]), set(history[b].tolist())) for b in range(B)]
    assert ranks.tolist() == expect


def test_metrics_from_ranks_exact():
    m = metrics_from_ranks(torch.tensor([1, 3, 11, 60]))
    assert m["hr@1"] == 0.25 and m["hr@10"] == 0.5 and m["hr@50"] == 0.75
    assert abs(m["ndcg@10"] - (1 + 1 / math.log2(4)) / 4) < 1e-12
    assert abs(m["ndcg@50"] - (1 + 1 / math.log2(4) + 1 / math.log2(12)) / 4) < 1e-12
    assert abs(m["mrr"] - (1 + 1 / 3 + 1 / 11 + 1 / 60) / 4) < 1e-12
