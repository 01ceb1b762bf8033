"""grlib.distributed.balance: every method places every sequence exactly once, keeps floor/ceil counts in
equal mode, is deterministic, matches JaggedBatch.split (none: the contiguous split) and hand-worked cases; LPT's
guarantees hold (max <= mean + max cost always, <= (4/3 - 1/(3P)) OPT unconstrained); on realistic
lognormal costs lpt and kk beat the random deal; bad input names the parameter."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.data.synthetic import user_lengths
from grlib.distributed.balance import METHODS, Assignment, assign, imbalance, max_over_mean
from grlib.jagged import JaggedBatch

# costs incl. zeros and ties (values from a small set) and spread-out ones; B = 0, 1 and B < P included
costs_st = st.one_of(
    st.lists(st.sampled_from([0.0, 1.0, 2.0, 5.0]), max_size=40),
    st.lists(st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False), max_size=40),
).map(lambda xs: np.array(xs, dtype=np.float64))


def quotas(n: int, ranks: int) -> list[int]:
    size, extra = divmod(n, ranks)
    return sorted([size + 1] * extra + [size] * (ranks - extra))


@given(costs=costs_st, ranks=st.integers(1, 9), method=st.sampled_from(METHODS), equal=st.booleans(),
       seed=st.integers(0, 2**31))
def test_every_sequence_once_counts_and_determinism(costs, ranks, method, equal, seed):
    a = assign(costs, ranks, method, equal_counts=equal, seed=seed)
    B = len(costs)
    assert a.owner.dtype == np.int64 and a.owner.shape == (B,) and a.ranks == ranks
    assert ((a.owner >= 0) & (a.owner < ranks)).all()
    rows = [a.rows(r) for r in range(ranks)]
    assert all((np.diff(r) > 0).all() and r.dtype == np.int64 for r in rows)  # ascending
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(B))  # a partition of range(B)
    np.testing.assert_array_equal(a.counts(), [len(r) for r in rows])
    np.testing.assert_allclose(a.loads(costs), [costs[r].sum() for r in rows])
    if equal or method in ("none", "random", "snake"):
        assert sorted(a.counts().tolist()) == quotas(B, ranks)
    np.testing.assert_array_equal(assign(costs.copy(), ranks, method, equal_counts=equal, seed=seed).owner, a.owner)


@given(costs=costs_st, ranks=st.integers(1, 9), equal=st.booleans())
def test_lpt_max_load_within_mean_plus_max_cost(costs, ranks, equal):
    """Unconstrained, a theorem (Graham): the last sequence of the busiest rank went to the least
    loaded rank, whose load was <= the mean. With equal counts it held on every case we tried
    (exhaustive small cases and random search), and this test keeps checking it."""
    loads = assign(costs, ranks, "lpt", equal_counts=equal).loads(costs)
    bound = costs.sum() / ranks + (costs.max() if len(costs) else 0.0)
    assert loads.max() <= bound * (1 + 1e-12) + 1e-12


@settings(max_examples=40)
@given(costs=st.lists(st.integers(0, 30), min_size=1, max_size=7).map(lambda xs: np.array(xs, float)),
       ranks=st.integers(2, 3))
def test_lpt_within_four_thirds_of_the_optimum(costs, ranks):
    """Unconstrained LPT: max load <= (4/3 - 1/(3P)) OPT, OPT by brute force over all P^B assignments."""
    opt = min(np.bincount(np.array(owner, dtype=np.int64), weights=costs, minlength=ranks).max()
              for owner in itertools.product(range(ranks), repeat=len(costs)))
    lpt = assign(costs, ranks, "lpt", equal_counts=False).loads(costs).max()
    assert lpt <= (4 / 3 - 1 / (3 * ranks)) * opt + 1e-9
    kk = assign(costs, ranks, "kk", equal_counts=False).loads(costs).max()
    assert opt <= kk and opt <= lpt  # nothing beats the optimum: checks the loads themselves


@given(batch=st.integers(0, 30), ranks=st.integers(1, 12))
def test_none_is_jagged_split(batch, ranks):
    offsets = torch.arange(batch + 1, dtype=torch.int64) * 2  # every sequence 2 tokens
    jb = JaggedBatch(item_ids=torch.arange(2 * batch), actions=torch.zeros(2 * batch, dtype=torch.int64),
                     timestamps=torch.zeros(2 * batch, dtype=torch.int64), offsets=offsets, max_len=2,
                     targets=torch.zeros(2 * batch, dtype=torch.int64))
    a = assign(np.ones(batch), ranks, "none")
    for r, part in enumerate(jb.split(ranks)):
        np.testing.assert_array_equal(a.rows(r), part.item_ids[::2].numpy() // 2)


def test_hand_worked_cases():
    six = np.array([6.0, 5, 4, 3, 2, 1])
    np.testing.assert_array_equal(assign(six, 3, "snake").owner, [0, 1, 2, 2, 1, 0])
    np.testing.assert_array_equal(assign(six, 3, "none").owner, [0, 0, 1, 1, 2, 2])
    # lpt: the quota binds with equal counts (rank 1 is full after two sequences)
    np.testing.assert_array_equal(assign(np.array([10.0, 1, 1, 1]), 2, "lpt", equal_counts=False).owner, [0, 1, 1, 1])
    np.testing.assert_array_equal(assign(np.array([10.0, 1, 1, 1]), 2, "lpt").owner, [0, 1, 1, 0])
    # kk, two ranks: 8-7 -> 1, 6-5 -> 1, 4-1 -> 3, 3-1 -> 2: loads 16 | 14, though 15 | 15 exists
    five = np.array([8.0, 7, 6, 5, 4])
    assert sorted(assign(five, 2, "kk", equal_counts=False).loads(five)) == [14, 16]
    # balanced kk: groups [8 7] [6 5] [4 dummy]; [4 0] + [7 8] -> [11 8]; [11 8] + [5 6] -> [16 14]
    a = assign(five, 2, "kk")
    assert sorted(a.loads(five)) == [14, 16] and sorted(a.counts()) == [2, 3]
    # random: a seeded permutation dealt in contiguous chunks
    r = assign(np.ones(10), 3, "random", seed=7)
    perm = np.random.default_rng(7).permutation(10)
    np.testing.assert_array_equal(r.owner[perm], [0, 0, 0, 0, 1, 1, 1, 2, 2, 2])


@pytest.mark.parametrize("seed", range(25))
def test_lpt_and_kk_beat_random_on_realistic_costs(seed):
    """Lognormal KuaiRand-like lengths, a quadratic cost, B >= 4P: lpt and kk give a lower max load
    than the random deal (per instance, on these seeds; not a theorem: a single dominant sequence
    can tie them). Snake is held to it on the median over the seeds (test_balance_sim)."""
    rng = np.random.default_rng(seed)
    ranks, users = int(rng.integers(2, 65)), int(rng.integers(4, 33))
    s = np.minimum(user_lengths(ranks * users, 1.0, rng), 16384).astype(np.float64)
    costs = 7e-6 * s + 1e-8 * s * s
    before = assign(costs, ranks, "random", seed=seed).loads(costs)
    for method, equal in itertools.product(("lpt", "kk"), (True, False)):
        after = assign(costs, ranks, method, equal_counts=equal).loads(costs)
        assert after.max() <= before.max() and imbalance(after) <= imbalance(before), (method, equal)


def test_large_batch_counts():
    """1536 ranks x 32 sequences: equal counts exact for lpt and kk (both modes place every one)."""
    costs = np.random.default_rng(0).lognormal(0, 1, 1536 * 32)
    for method in ("lpt", "kk"):
        assert (assign(costs, 1536, method).counts() == 32).all()
        assert assign(costs, 1536, method, equal_counts=False).counts().sum() == costs.size


def test_figures():
    assert imbalance(np.array([1.0, 2, 4])) == 0.75
    assert max_over_mean(np.array([1.0, 2, 4])) == pytest.approx(4 / (7 / 3))
    assert imbalance(np.zeros(3)) == 0.0 and max_over_mean(np.zeros(3)) == 1.0
    with pytest.raises(ValueError, match="loads"):
        imbalance(np.array([]))


@pytest.mark.parametrize("kw, match", [
    ({"method": "greedy"}, "method must be one of none, random, snake, lpt, kk"),
    ({"ranks": 0}, "ranks"), ({"ranks": 2.5}, "ranks"), ({"ranks": True}, "ranks"),
    ({"costs": np.array([1.0, -1.0])}, "costs"), ({"costs": np.array([1.0, np.nan])}, "costs"),
    ({"costs": np.array([np.inf])}, "costs"), ({"costs": np.ones((2, 2))}, "costs"),
])
def test_bad_input(kw, match):
    args = {"costs": np.ones(4), "ranks": 2, "method": "lpt", **kw}
    with pytest.raises(ValueError, match=match):
        assign(args["costs"], args["ranks"], args["method"])


def test_assignment_checks():
    a = Assignment(owner=np.array([0, 1, 1], dtype=np.int64), ranks=2)
    with pytest.raises(ValueError, match="rank"):
        a.rows(2)
    with pytest.raises(ValueError, match="costs"):
        a.loads(np.ones(4))
