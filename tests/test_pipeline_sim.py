"""The discrete-event pipeline model (grlib.sim.pipeline) and the cluster-scale loads it runs on
(grlib.sim.scaleout): exact step times of hand-sized cases, what each schedule hides, invariants on
random ragged loads, the compute fit, and the device compute of padded vs fused attention."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grlib.config import ModelConfig
from grlib.distributed.cost import FlopsCost, QuadraticCost
from grlib.perf import sequence_flops
from grlib.sim.alltoall import PRESETS, Cluster, Link, flat_time, two_stage_time
from grlib.sim.pipeline import Machine, Setup, StepLoad, allreduce_s, meta_s, ring_s, simulate, tiny_s, trip_s
from grlib.sim.scaleout import (DEVICES, Workload, cluster_loads, fit_step_compute, nonneg_lstsq, padded_flops,
                                rank_compute)

LINK = Link(1e-3, 1e-9)
GLOO = Machine(Cluster("t", 2, LINK, LINK, "test"), streams=False)
DEVICE = Machine(Cluster("t", 2, LINK, LINK, "test"), streams=True)


def _load(P: int = 2, compute=(0.1, 0.05, 0.2, 0.01), rows=(1000.0, 2000.0), plan: float = 0.01) -> StepLoad:
    return StepLoad(np.tile(np.asarray(compute, dtype=float)[:, None], (1, P)), np.full(P, rows[0]),
                    np.full(P, rows[1]), 1024, 4e6, plan, np.full(P, 100.0))


def _steady(setup: Setup, machine: Machine, load: StepLoad, steps: int = 8) -> float:
    out = simulate(setup, machine, [load] * steps, warm=2)
    assert np.allclose(out.step_s[:-2], out.step_s[0])  # identical steps: a steady state (the last k have
    # no batch i + k to look up ahead)
    return float(out.step_s[0])


def test_one_rank_runs_plan_and_compute_only():
    load = _load(P=1)
    for setup in (Setup("sync"), Setup("prefetch"), Setup("semisync", 1)):
        out = simulate(setup, GLOO, [load] * 4)
        compute = load.compute.sum()
        expected = compute + (load.plan_s if setup.schedule == "sync" else 0.0)  # the worker plans ahead
        assert out.step_s == pytest.approx([expected] * 3)
        assert out.utilisation[0] == pytest.approx(compute / expected) and out.exposed_comm_s == 0.0


def test_sync_step_is_compute_plus_every_collective():
    load = _load()
    rows_in = trip_s(GLOO, Setup(), load.rows_input * 1024)
    rows_loss = trip_s(GLOO, Setup(), load.rows_loss * 1024)
    ids_in = meta_s(GLOO, Setup(), 2) + trip_s(GLOO, Setup(), load.rows_input * 8)
    ids_loss = meta_s(GLOO, Setup(), 2) + trip_s(GLOO, Setup(), load.rows_loss * 8)
    comm = (2 * tiny_s(GLOO, 2) + ids_in + ids_loss + 2 * rows_in + 2 * rows_loss + allreduce_s(GLOO, 2, 4e6))
    compute = load.compute[:, 0].sum()  # equal on both ranks
    assert _steady(Setup("sync"), GLOO, load) == pytest.approx(load.plan_s + compute + comm)
    # prefetch hides the plan and both ids' trips (the worker keeps ahead); semisync on gloo only moves
    # the input rows' trip to the step's start; with a comm stream it hides it too
    assert _steady(Setup("prefetch"), GLOO, load) == pytest.approx(compute + comm - ids_in - ids_loss)
    assert _steady(Setup("semisync", 1), GLOO, load) == pytest.approx(_steady(Setup("prefetch"), GLOO, load))
    assert _steady(Setup("semisync", 1), DEVICE, load) == pytest.approx(
        _steady(Setup("prefetch"), DEVICE, load) - rows_in)


def test_the_slowest_rank_sets_the_step_and_the_others_wait():
    load = _load()
    load.compute[:, 1] *= 2  # rank 1 computes twice as long
    out = simulate(Setup("sync"), GLOO, [load] * 6, warm=2)
    busy = load.compute.sum(0)
    assert out.busy_s == pytest.approx(busy)
    assert out.utilisation[0] == pytest.approx(busy[0] / out.step_s[0], rel=1e-9)
    assert out.utilisation[0] < 0.55 < out.utilisation[1] < 1
    assert out.step_s[0] > busy.max()


def test_bucketed_allreduce_hides_behind_backward():
    load = dataclasses.replace(_load(), grad_bytes=2e8)  # 0.2 s of all-reduce against 0.2 s of backward
    plain = _steady(Setup("semisync", 1), DEVICE, load)
    bucketed = _steady(Setup("semisync", 1, overlap_allreduce=True, buckets=8), DEVICE, load)
    ar = allreduce_s(DEVICE, 2, 2e8)
    assert bucketed < plain - ar / 2 and bucketed >= load.compute[:, 0].sum()
    with pytest.raises(ValueError, match="communication streams"):
        simulate(Setup("sync", overlap_allreduce=True), GLOO, [load] * 3)


def test_sparse_stream_leaves_only_the_input_gradients_exposed():
    """pipelined: the rows' trips beside forward, the loss rows' gradients beside backward; with a small
    all-reduce the step is compute + the two tiny collectives + the input rows' gradient trip."""
    load = _load()
    rows_in = trip_s(DEVICE, Setup(), load.rows_input * 1024)
    compute = load.compute[:, 0].sum()
    ar = allreduce_s(DEVICE, 2, load.grad_bytes)
    piped = Setup("semisync", 1, overlap_allreduce=True, buckets=8, sparse_stream=True)
    assert _steady(piped, DEVICE, load) == pytest.approx(compute + 2 * tiny_s(DEVICE, 2) + rows_in + ar / 8)
    assert _steady(piped, DEVICE, load) < _steady(Setup("semisync", 1, overlap_allreduce=True, buckets=8), DEVICE, load)
    # k = 0: the input rows of batch i at the start of step i: forward waits for them
    exact = Setup("prefetch", overlap_allreduce=True, buckets=8, sparse_stream=True)
    assert _steady(exact, DEVICE, load) == pytest.approx(_steady(piped, DEVICE, load) + rows_in)
    with pytest.raises(ValueError, match="sparse_stream needs the routes built ahead"):
        Setup("sync", sparse_stream=True)
    with pytest.raises(ValueError, match="communication streams"):
        simulate(Setup("prefetch", sparse_stream=True), GLOO, [load] * 3)


def test_setup_refuses_bad_choices():
    with pytest.raises(ValueError, match="schedule must be one of"):
        Setup("async")
    with pytest.raises(ValueError, match="staleness"):
        Setup("prefetch", 1)
    with pytest.raises(ValueError, match="node_dedup"):
        Setup("sync", items="flat", node_dedup=0.5)
    with pytest.raises(ValueError, match="more than warm"):
        simulate(Setup(), GLOO, [_load()], warm=1)


def test_collectives_follow_their_formulas():
    gpu = Machine(PRESETS["gpu-8"], streams=True)
    intra, inter = gpu.cluster.intra, gpu.cluster.inter
    # one node: 2(P-1) intra steps; 1536 = 192 nodes: 2 x 191 steps cross nodes (NCCL's ring latency)
    assert allreduce_s(gpu, 8, 8e6) == pytest.approx(14 * intra.alpha_s + 14 / 8 * 8e6 * intra.beta_s_per_byte)
    assert allreduce_s(gpu, 1536, 1.536e9) == pytest.approx(
        (3070 - 382) * intra.alpha_s + 382 * inter.alpha_s + 3070 * 1e6 * inter.beta_s_per_byte)
    assert ring_s(gpu, 1, 2, 1e6) == 0.0 and tiny_s(gpu, 1536) == pytest.approx(22 * inter.alpha_s)
    m = np.full(1536, 1e5)
    assert trip_s(gpu, Setup(items="flat"), m) == pytest.approx(flat_time(gpu.cluster, 1536, 1e5))
    assert trip_s(gpu, Setup(items="hierarchical", node_dedup=0.5), m) == pytest.approx(
        two_stage_time(gpu.cluster, 1536, 1e5, 0.5))
    assert allreduce_s(gpu, 64, 1e9) < allreduce_s(gpu, 512, 1e9) < allreduce_s(gpu, 1536, 1e9)


@st.composite
def _loads(draw):
    P = draw(st.integers(1, 5))
    steps = draw(st.integers(2, 5))
    seconds = st.floats(0.0, 0.5, allow_nan=False)
    rows = st.floats(0.0, 5000.0, allow_nan=False)
    loads = [StepLoad(np.array([[draw(seconds) for _ in range(P)] for _ in range(4)]) + 1e-3,
                      np.array([draw(rows) for _ in range(P)]), np.array([draw(rows) for _ in range(P)]),
                      draw(st.sampled_from([64, 1024])), draw(st.floats(0.0, 1e7)), draw(st.floats(0.0, 0.05)))
             for _ in range(steps)]
    return loads


@given(_loads(), st.sampled_from([("sync", 0), ("prefetch", 0), ("semisync", 1), ("semisync", 2)]),
       st.booleans())
def test_steps_never_beat_the_slowest_rank_and_utilisation_is_a_fraction(loads, schedule, streams):
    m = Machine(Cluster("one per node", 1, LINK, Link(2e-3, 2e-9), "test"), streams)  # any rank count
    out = simulate(Setup(*schedule), m, loads, warm=1)
    slowest = np.array([ld.compute.sum(0).max() for ld in loads[1:]])
    assert out.step_s.sum() >= slowest.sum() * (1 - 1e-9) - 1e-12 or out.step_s.size == 0
    assert np.all(out.utilisation > 0) and np.all(out.utilisation <= 1 + 1e-9)
    assert out.busy_s == pytest.approx(np.mean([ld.compute.sum(0) for ld in loads[1:]], axis=0))
    # the run ends no later than under sync (the main lane's work is sync's minus what moved away; a
    # single step may end later: semisync(k) waits for the plan of batch i+k before step i)
    end = simulate(Setup(*schedule), m, loads, warm=0).step_s.sum()
    assert end <= simulate(Setup("sync"), m, loads, warm=0).step_s.sum() + 1e-9


@given(st.lists(st.lists(st.integers(1, 300), min_size=0, max_size=12), min_size=4, max_size=12),
       st.floats(1e-3, 0.1), st.floats(0.0, 2.0), st.floats(0.0, 1e-4))
def test_the_compute_fit_predicts_steps_it_was_made_from(batches, c0, kappa, per_token):
    layer = QuadraticCost(1e-5, 2e-6, 3e-9)
    lengths = [np.asarray(b, dtype=np.int64) for b in batches]  # ragged, empty batches included
    truth = [c0 + kappa * 2 * layer(s).sum() + per_token * s.sum() for s in lengths]
    fit = fit_step_compute(layer, 2, lengths, truth)
    assert [fit(s) for s in lengths] == pytest.approx(truth, rel=1e-6)
    assert min(fit.c0, fit.kappa, fit.per_token) >= 0 and max(abs(r) for r in fit.residuals) < 1e-6
    with pytest.raises(ValueError, match=">= 3 steps"):
        fit_step_compute(layer, 2, lengths[:2], truth[:2])


def test_nonneg_lstsq_keeps_coefficients_non_negative():
    A = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    assert nonneg_lstsq(A, np.array([1.0, 2.0, 3.0])) == pytest.approx([1.0, 1.0])
    assert nonneg_lstsq(A, np.array([3.0, 2.0, 1.0])) == pytest.approx([2.0, 0.0])  # free fit: slope -1


PAPER = ModelConfig(name="hstu", n_layers=2, n_heads=4, d_model=64, dropout=0.0)


@given(st.lists(st.integers(1, 500), min_size=1, max_size=16))
def test_padding_adds_the_square_minus_the_triangle(lengths):
    s = np.asarray(lengths, dtype=np.float64)
    N, D = PAPER.n_heads, PAPER.d_model // PAPER.n_heads
    extra = PAPER.n_layers * 3.5 * 4 * N * D * (s.size * s.max() ** 2 - (s * s).sum() / 2)
    assert padded_flops(s, PAPER) == pytest.approx(sequence_flops(s, PAPER) + extra)
    assert padded_flops(np.array([]), PAPER) == 0.0


def test_rank_compute_splits_flops_at_the_device_rate():
    wl = Workload(PAPER, 4, 512, 128, 4, 10_000, 0.5)
    dev = DEVICES["h100-bf16"]
    s = np.array([100, 300, 1])
    f, lo, b, o = rank_compute(s, wl, dev, 0.5, padded=False)
    rate = dev.peak_flops * 0.5
    assert f == pytest.approx(sequence_flops(s, PAPER, backward=False) / rate)
    assert f + b == pytest.approx((sequence_flops(s, PAPER) + 6 * 401 * 128 * 64) / rate - lo)
    assert o == pytest.approx(28 * 10_000 / dev.memory_bytes_per_s)
    assert rank_compute(s, wl, dev, 0.5, padded=True)[0] > f
    with pytest.raises(ValueError, match="rows_per_token"):
        Workload(PAPER, 4, 512, 128, 4, 10_000, 0.0)


def test_cluster_loads_keep_the_users_and_balance_beats_random():
    pool = np.random.default_rng(0).lognormal(5, 0.8, 5000).clip(1, 2000).astype(np.int64)
    wl = Workload(PAPER, 32, 1024, 64, 4, 10_000, 0.6)
    dev = DEVICES["h100-bf16"]
    spread = {}
    for method in ("random", "kk"):
        loads = cluster_loads(pool, 16, wl, dev, 0.4, method=method, steps=3, seed=1, plan_s=0.002)
        assert all(ld.ranks == 16 and ld.plan_s == 0.002 for ld in loads)
        assert all(ld.rows_loss == pytest.approx((ld.tokens * 0.6 + 64) / 16) for ld in loads)
        spread[method] = np.mean([(c.max() - c.min()) / c.max() for c in (ld.compute.sum(0) for ld in loads)])
    same = cluster_loads(pool, 16, wl, dev, 0.4, method="random", steps=3, seed=1)
    assert sum(ld.tokens.sum() for ld in same) == sum(ld.tokens.sum() for ld in cluster_loads(
        pool, 16, wl, dev, 0.4, method="kk", steps=3, seed=1))  # the same users, assigned differently
    assert spread["kk"] < spread["random"] / 3
    with pytest.raises(ValueError, match="efficiency"):
        cluster_loads(pool, 16, wl, dev, 1.5)
    assert math.isclose(FlopsCost(PAPER)(np.array([7]))[0], sequence_flops(np.array([7]), PAPER))
