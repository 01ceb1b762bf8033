"""grlib.distributed.cost: fit_quadratic recovers exact quadratics, keeps coefficients non-negative at the
constrained optimum, rejects bad input; FlopsCost agrees with grlib.perf.sequence_flops per
sequence; calibrate_layer's rounds, per-length batch size and medians on synthetic timings (a
quadratic recovered exactly through bursts of other work), and on the real layer (it runs, on one
thread, leaving the thread count as it found it)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib.config import ModelConfig
from grlib.distributed.cost import FlopsCost, QuadraticCost, calibrate_layer, fit_quadratic
from grlib.perf import sequence_flops

LENGTHS = np.unique(np.round(np.geomspace(16, 4096, 12)).astype(np.int64))  # [12]


def weighted_loss(cost: QuadraticCost, s: np.ndarray, y: np.ndarray) -> float:
    return float(((cost(s) / y - 1.0) ** 2).sum())


@given(c0=st.floats(1e-6, 1e-2), a=st.one_of(st.just(0.0), st.floats(1e-8, 1e-4)),
       b=st.one_of(st.just(0.0), st.floats(1e-12, 1e-7)))
def test_recovers_an_exact_quadratic(c0, a, b):
    s = LENGTHS.astype(np.float64)
    fit = fit_quadratic(s, c0 + a * s + b * s * s)
    scale = c0 + a * s.max() + b * s.max() ** 2  # coefficients compared on the time they contribute
    assert fit.c0 == pytest.approx(c0, abs=1e-7 * scale)
    assert fit.a * s.max() == pytest.approx(a * s.max(), abs=1e-7 * scale)
    assert fit.b * s.max() ** 2 == pytest.approx(b * s.max() ** 2, abs=1e-7 * scale)
    assert max(map(abs, fit.residuals)) < 1e-7
    if a == b == 0:  # constant seconds: R^2 is undefined (no variance to explain)
        assert np.isnan(fit.r2)
    else:
        assert fit.r2 == pytest.approx(1.0, abs=1e-9)
    assert len(fit.residuals) == len(s) and set(fit.params()) == {"c0", "a", "b", "r2"}


@given(seed=st.integers(0, 2**31))
def test_non_negative_and_the_constrained_optimum(seed):
    """Data a negative coefficient would fit better (a dip, or a curve bending down): every
    coefficient >= 0, and no non-negative quadratic of a random sample fits better."""
    rng = np.random.default_rng(seed)
    s = np.sort(rng.choice(np.arange(1, 5000), size=int(rng.integers(3, 15)), replace=False)).astype(np.float64)
    y = np.abs(rng.normal(1e-3, 1e-3, s.size) + rng.choice([-1, 1]) * 1e-10 * s * s) + 1e-5  # [n] > 0
    fit = fit_quadratic(s, y)
    assert min(fit.c0, fit.a, fit.b) >= 0
    best = weighted_loss(fit, s, y)
    for c0, a, b in rng.random((200, 3)) * [3e-3, 1e-6, 1e-10] * rng.choice([0.0, 1.0], (200, 3)):
        assert best <= weighted_loss(QuadraticCost(c0, a, b), s, y) * (1 + 1e-9)


def test_a_negative_coefficient_is_refitted_without_it():
    s = np.array([10.0, 100, 1000, 2000, 4000])
    fit = fit_quadratic(s, 1.0 - 1e-4 * s + 1e-7 * s * s)  # positive everywhere here, a < 0 in truth
    assert fit.a == 0.0 and fit.c0 > 0 and fit.b > 0
    np.testing.assert_allclose(fit(s), fit.c0 + fit.b * s * s)


def test_cost_call():
    cost = QuadraticCost(c0=1.0, a=2.0, b=3.0)
    out = cost([0, 1, 2])
    assert out.dtype == np.float64 and out.tolist() == [1.0, 6.0, 17.0]


@pytest.mark.parametrize("lengths, seconds, match", [
    ([1, 2], [1.0, 2.0], "at least 3 distinct"),
    ([1, 1, 2], [1.0, 1.0, 2.0], "at least 3 distinct"),
    ([1, 2, 3], [1.0, 2.0], "same shape"),
    ([[1, 2, 3]], [[1.0, 2.0, 3.0]], "one-dimensional"),
    ([1, 2, 3], [1.0, 0.0, 3.0], "seconds finite and > 0"),
    ([1, 2, 3], [1.0, np.nan, 3.0], "finite"),
    ([-1, 2, 3], [1.0, 2.0, 3.0], "lengths must be finite and >= 0"),
])
def test_bad_fit_input(lengths, seconds, match):
    with pytest.raises(ValueError, match=match):
        fit_quadratic(lengths, seconds)


@pytest.mark.parametrize("cfg", [ModelConfig(name="hstu", n_layers=16, n_heads=12, d_model=1536),
                                 ModelConfig(name="hstu", n_layers=2, n_heads=2, d_model=64),
                                 ModelConfig(name="sasrec", n_layers=2, n_heads=1, d_model=32)])
@given(lengths=st.lists(st.integers(0, 20000), max_size=20))
def test_flops_cost_is_sequence_flops_per_sequence(cfg, lengths):
    cost = FlopsCost(cfg)
    out = cost(np.array(lengths, dtype=np.int64))
    assert out.shape == (len(lengths),) and out.dtype == np.float64
    for s, f in zip(lengths, out):
        assert f == pytest.approx(sequence_flops(np.array([s]), cfg), rel=1e-9, abs=1e-6)
    assert out.sum() == pytest.approx(sequence_flops(np.array(lengths), cfg), rel=1e-9, abs=1e-6)
    assert cost.params()["d_model"] == cfg.d_model


def _true_seconds(s: int) -> float:
    """The synthetic layer's seconds per sequence of length s (a quadratic: c0 + a*s + b*s^2)."""
    return 2e-4 + 3e-7 * s + 4e-10 * s * s


def test_calibration_on_synthetic_timings_recovers_the_quadratic(monkeypatch):
    """calibrate_layer's bookkeeping on synthetic timings, so nothing depends on this machine's speed:
    the timer (cost._timed) is replaced by a layer whose pass over k sequences of length s takes
    k * _true_seconds(s) on-CPU seconds (1.5x that of wall), with a burst of other work slowing one
    round of every length 4x and another round of the longest 3x. Checked: k is the fewest sequences
    for one run to reach min_seconds, the timed runs go in rounds over all the lengths, the median
    drops the bursts (the rows are the true seconds per sequence), the runs see one thread (restored
    after), and fit_quadratic on the rows recovers the quadratic (R^2 = 1). How well a quadratic fits
    this machine's measured layer is stage `balance`'s row (the calibration's r2), never a test's."""
    from grlib.distributed import cost
    from grlib.model.hstu import HSTULayer

    calls: list[tuple[int, int]] = []  # (length, sequences) per timed pass, in order
    seen: dict[int, int] = {}  # passes per length so far

    def fake_timed(layer, batch, repeats):
        assert isinstance(layer, HSTULayer) and layer.training and repeats == 1
        assert torch.get_num_threads() == 1
        lengths = batch.offsets.diff()
        s, k = int(lengths[0]), len(lengths)
        assert (lengths == s).all() and batch.num_tokens == s * k
        calls.append((s, k))
        n = seen[s] = seen.get(s, 0) + 1  # passes 1-3: warm-up, the once-timed run, warm-up at k; then the rounds
        burst = 4.0 if n == 5 else 3.0 if (n == 7 and s == LENGTHS.max()) else 1.0
        t = k * _true_seconds(s) * burst
        return t, 1.5 * t

    monkeypatch.setattr(cost, "_timed", fake_timed)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rows = calibrate_layer(ModelConfig(name="hstu", n_heads=2, d_model=64), LENGTHS.tolist(), min_seconds=0.05)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    ks = [max(1, math.ceil(0.05 / _true_seconds(s))) for s in LENGTHS.tolist()]
    assert [r["length"] for r in rows] == LENGTHS.tolist() and [r["sequences"] for r in rows] == ks
    warm = [c for s, k in zip(LENGTHS.tolist(), ks) for c in ((s, 1), (s, 1), (s, k))]
    assert calls == warm + list(zip(LENGTHS.tolist(), ks)) * 5  # 5 rounds over all the lengths
    for r in rows:
        assert r["repeats"] == 5
        assert r["seconds_per_sequence"] == pytest.approx(_true_seconds(r["length"]), rel=1e-12)
        assert r["wall_seconds_per_sequence"] == pytest.approx(1.5 * _true_seconds(r["length"]), rel=1e-12)
    fit = fit_quadratic([r["length"] for r in rows], [r["seconds_per_sequence"] for r in rows])
    assert (fit.c0, fit.a, fit.b) == pytest.approx((2e-4, 3e-7, 4e-10), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_calibration_runs_the_layer():
    """The real layer, timed (nothing asserted on how long: the seconds only have to be there)."""
    threads = torch.get_num_threads()
    rows = calibrate_layer(ModelConfig(name="hstu", n_heads=2, d_model=64), [16, 64, 256], repeats=2, min_seconds=0)
    assert torch.get_num_threads() == threads
    assert [(r["length"], r["sequences"], r["repeats"]) for r in rows] == [(16, 1, 2), (64, 1, 2), (256, 1, 2)]
    assert all(math.isfinite(r["seconds_per_sequence"]) and r["seconds_per_sequence"] > 0 for r in rows)


def test_calibrate_bad_input():
    with pytest.raises(ValueError, match="model.name must be 'hstu'"):
        calibrate_layer(ModelConfig(name="sasrec"), [16])
    with pytest.raises(ValueError, match="lengths"):
        calibrate_layer(ModelConfig(name="hstu"), [0, 16])
    with pytest.raises(ValueError, match="repeats"):
        calibrate_layer(ModelConfig(name="hstu"), [16], repeats=0)
