"""Full-ranking metrics agree with a brute-force per-user computation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.schema import FIRST_ITEM_ID
from grlib.data.sequences import JaggedBatch
from grlib.evaluate import evaluate, metrics_from_ranks, ranks_from_scores, repeat_fraction


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
    history = [h[h != t] for h, t in zip(history, targets)]  # masking is refused for repeat targets
    ranks = ranks_from_scores(torch.from_numpy(scores), torch.from_numpy(targets), history)
    expect = [brute_force_rank(scores[b].tolist(), int(targets[b]), set(history[b].tolist())) for b in range(B)]
    assert ranks.tolist() == expect


def test_metrics_from_ranks_exact():
    m = metrics_from_ranks(torch.tensor([1, 3, 11, 60]))
    assert m["hr@1"] == 0.25 and m["hr@10"] == 0.5 and m["hr@50"] == 0.75
    assert abs(m["ndcg@10"] - (1 + 1 / math.log2(4)) / 4) < 1e-12
    assert abs(m["ndcg@50"] - (1 + 1 / math.log2(4) + 1 / math.log2(12)) / 4) < 1e-12
    assert abs(m["mrr"] - (1 + 1 / 3 + 1 / 11 + 1 / 60) / 4) < 1e-12


# ---- evaluate() end to end against a brute-force per-user computation -------------------------

def _brute_metrics(scores: np.ndarray, targets: np.ndarray, history: list[np.ndarray], mask: bool) -> dict:
    ranks = [brute_force_rank(scores[b].tolist(), int(targets[b]), set(history[b].tolist()) if mask else set())
             for b in range(len(targets))]
    out = {f"hr@{k}": float(np.mean([r <= k for r in ranks])) for k in (1, 10, 50)}
    for k in (10, 50):
        out[f"ndcg@{k}"] = float(np.mean([(1 / math.log2(r + 1)) if r <= k else 0.0 for r in ranks]))
    out["mrr"] = float(np.mean([1 / r for r in ranks]))
    return out


def _batches(scores: np.ndarray, targets: np.ndarray, history: list[np.ndarray], batch_size: int):
    for i in range(0, len(targets), batch_size):
        rows = range(i, min(i + batch_size, len(targets)))
        T = len(rows)
        yield JaggedBatch(item_ids=torch.as_tensor(list(rows), dtype=torch.int64),  # row index, read by the scorer
                          actions=torch.zeros(T, dtype=torch.int64), timestamps=torch.zeros(T, dtype=torch.int64),
                          offsets=torch.arange(T + 1), max_len=1, targets=torch.zeros(T, dtype=torch.int64),
                          eval_targets=torch.as_tensor(targets[list(rows)]), history=[history[r] for r in rows])


@settings(max_examples=25)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(FIRST_ITEM_ID + 60, 120), st.booleans(),
       st.booleans(), st.integers(1, 16))
def test_evaluate_matches_brute_force(seed, B, V, ties, mask, batch_size):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 5, (B, V)).astype(np.float32) if ties else rng.standard_normal((B, V)).astype(np.float32)
    targets = rng.integers(FIRST_ITEM_ID, V, B)
    history = []
    for b in range(B):
        h = rng.integers(0, V, rng.integers(0, 30))
        history.append(h[h != targets[b]] if mask else h)  # masking needs targets outside their history
    score_fn = lambda batch: torch.from_numpy(scores)[batch.item_ids]  # noqa: E731
    got = evaluate(score_fn, _batches(scores, targets, history, batch_size), mask_history=mask)
    expect = _brute_metrics(scores, targets, history, mask)
    assert got["users"] == B
    for k, v in expect.items():
        assert abs(got[k] - v) <= 1e-6, (k, got[k], v)


def test_masking_refuses_repeat_targets_that_would_leak():
    """With a repeat target, masking the other history items would let a 'most recent item'
    scorer rank the target first: refused, and repeat_fraction reports the share."""
    scores = np.zeros((2, 10), np.float32)
    scores[:, [3, 4, 5]] = [1, 2, 3]  # history items scored by recency
    targets = np.array([4, 7])
    history = [np.array([3, 4, 5]), np.array([3, 4, 5])]
    score_fn = lambda batch: torch.from_numpy(scores)[batch.item_ids]  # noqa: E731
    with pytest.raises(ValueError, match="row 0's target 4 is in its history"):
        evaluate(score_fn, _batches(scores, targets, history, 2), mask_history=True)
    assert repeat_fraction(_batches(scores, targets, history, 1)) == 0.5
    unmasked = evaluate(score_fn, _batches(scores, targets, history, 2), mask_history=False)
    assert unmasked["hr@1"] == 0.0  # item 5 outranks the repeat target 4
