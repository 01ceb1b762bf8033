"""FLOPs accounting (recsys-examples' HSTU formula), the peak measured in the run (no cache), MFU."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from grlib import perf
from grlib.hardware import gemm
from grlib.config import ModelConfig
from grlib.data.sequences import JaggedBatch
from grlib.model import build_model

CFG = ModelConfig(name="hstu", n_layers=2, n_heads=2, d_model=8, dropout=0.0, attention_impl="reference")


def test_hstu_flops_by_hand():
    # one layer, N=2 heads of D=4, H=8, lengths 3, 0, 5
    cfg = ModelConfig(name="hstu", n_layers=1, n_heads=2, d_model=8)
    N, D, H = 2, 4, 8
    gemm = sum(2 * s * 4 * N * D * H + 2 * s * N * D * H for s in (3, 0, 5))
    attn = sum(4 * N * D * s * s / 2 for s in (3, 0, 5))
    other_fwd = sum(s * N * D + s * H for s in (3, 0, 5))
    other_bwd = sum(2 * s * N * D + s * H for s in (3, 0, 5))
    assert perf.sequence_flops([3, 0, 5], cfg, backward=False) == gemm + attn + other_fwd
    assert perf.sequence_flops([3, 0, 5], cfg, backward=True) == 3 * gemm + 3.5 * attn + other_bwd
    assert perf.sequence_flops([3, 0, 5], ModelConfig(name="hstu", n_layers=3, n_heads=2, d_model=8)) == \
        3 * perf.sequence_flops([3, 0, 5], cfg)


def test_real_lengths_not_padded_ones():
    real = perf.batch_flops(torch.tensor([0, 5, 6, 6, 14]), CFG)
    assert real == perf.sequence_flops([5, 1, 0, 8], CFG)
    assert real < perf.sequence_flops([8, 8, 8, 8], CFG)
    assert perf.sequence_flops([0, 0], CFG) == 0


@pytest.fixture(params=["blas", "onednn"])
def gemm_library(request, monkeypatch):
    """Each fp32 GEMM library forced (GRLIB_GEMM), not the one this session measured as faster."""
    from grlib.ops import gemm_choice

    monkeypatch.setenv(gemm_choice.GEMM_ENV, request.param)
    gemm_choice.record.cache_clear()
    yield request.param
    gemm_choice.record.cache_clear()


@pytest.mark.parametrize("backward", [False, True])
def test_projection_flops_match_torch_flop_counter(backward, gemm_library):
    """The projection term equals what torch counts for the layers' matmuls (attention aside). Through
    oneDNN, a linear's backward gets db from its dW product given x^T a row of ones (grlib/ops/matmul.py):
    2 T out more FLOPs per linear layer, which the model's FLOPs (and MFU) do not count."""
    torch.manual_seed(0)
    model = build_model(CFG, 30, 8).train()
    T = 14
    batch = JaggedBatch(item_ids=torch.randint(2, 30, (T,)), actions=torch.zeros(T, dtype=torch.int64),
                        timestamps=torch.arange(T) * 60, offsets=torch.tensor([0, 5, 6, 6, 14]), max_len=8,
                        targets=torch.zeros(T, dtype=torch.int64))
    with FlopCounterMode(display=False) as counter:
        out = model(batch)
        if backward:
            out.sum().backward()
    counts = counter.get_flop_counts()["Global"]
    linear = sum(v for op, v in counts.items() if str(op).split(".")[1] in ("addmm", "mm", "_linear_pointwise"))
    lengths = torch.tensor([5, 1, 0, 8])
    N, D, H = CFG.n_heads, CFG.d_model // CFG.n_heads, CFG.d_model
    gemm = CFG.n_layers * float((2 * lengths * 4 * N * D * H + 2 * lengths * N * D * H).sum())
    ones_row = CFG.n_layers * float(2 * lengths.sum() * (4 * N * D + H))  # uvqk [H -> 4 N D], out [N D -> H]
    extra = ones_row if backward and gemm_library == "onednn" else 0.0
    assert linear == (3 if backward else 1) * gemm + extra


def test_sasrec_counts_and_popularity_refused():
    cfg = ModelConfig(name="sasrec", n_layers=1, n_heads=2, d_model=8)
    assert perf.sequence_flops([4], cfg, backward=False) == 2 * 4 * 4 * 64 + 2 * 2 * 4 * 64 + 4 * 8 * 16 / 2
    with pytest.raises(ValueError, match="popularity"):
        perf.sequence_flops([4], ModelConfig(name="popularity"))


def test_peak_is_measured_at_every_call_and_never_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("GRLIB_DATA_DIR", str(tmp_path))
    readings = iter([1e11, 2e11])
    monkeypatch.setattr(gemm, "measure_peak_flops", lambda **kw: {"peak_flops": next(readings), "per_size": {}})
    assert perf.peak_flops() == 1e11 and perf.peak_flops() == 2e11  # a second call measures again
    assert not any(tmp_path.rglob("*"))  # nothing written under the data folder (no <data>/cache/peak_flops.json)


def test_measured_peak_brackets_the_block_and_uses_the_higher(monkeypatch):
    readings, events = iter([(3e11, 1e11), (2e11, 2e11)]), []

    def measure(sizes, dtype):
        assert sizes == perf.PEAK_SIZES and dtype == torch.float32
        events.append("peak")
        on_cpu, wall = next(readings)
        return {"peak_flops": on_cpu, "peak_flops_wall": wall, "dtype": "float32",
                "per_library": {"blas": on_cpu / 2, "onednn": on_cpu} if len(events) == 1 else {"blas": wall}}

    monkeypatch.setattr(gemm, "measure_peak_flops", measure)
    with perf.measured_peak() as peak:
        events.append("steps")
        with pytest.raises(RuntimeError, match="not taken yet"):
            peak.flops
    assert events == ["peak", "steps", "peak"]
    assert (peak.before, peak.after, peak.flops) == (3e11, 2e11, 3e11)
    assert (peak.before_wall, peak.after_wall, peak.flops_wall) == (1e11, 2e11, 2e11)
    assert peak.per_library == {"blas": 2e11, "onednn": 3e11}  # each library's best of before and after
    assert "measured float32 GEMM peak 300.0 GFLOP/s" in peak.describe()


def test_measured_peak_is_a_real_gemm_rate():
    out = perf.measure_peak_flops(sizes=(64, 128), repeats=2, warmup=1)
    assert set(out["per_size"]) == set(out["per_size_wall"]) == {64, 128}
    assert out["peak_flops"] == max(out["per_size"].values())
    assert out["peak_flops_wall"] == max(out["per_size_wall"].values())
    for n in (64, 128):  # the on-CPU time never exceeds the wall time, so the rate is at least the wall-clock one
        assert math.isfinite(out["per_size"][n]) and out["per_size"][n] >= out["per_size_wall"][n] > 0
    assert out["threads"] == torch.get_num_threads() and out["dtype"] == "float32"
    assert set(out["per_library"]) == set(perf.gemm_libraries()) and out["library"] in out["per_library"]
    assert out["peak_flops"] == max(out["per_library"].values()) == out["per_library"][out["library"]]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch was built without oneDNN")
def test_onednn_gemm_of_the_peak_computes_the_product():
    """The oneDNN GEMM the peak times is a real product (a . b^T), not an empty call."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    out = gemm._gemm("onednn", a, b, torch.empty(64, 64))()
    torch.testing.assert_close(out, a @ b.T, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="blas, onednn"):
        gemm._gemm("cublas", a, b, a)


def test_peak_counts_on_cpu_time_not_time_spent_waiting(monkeypatch):
    """A GEMM that waited for a core (wall 4 s, 2 threads on CPU 1 s each) counts as 1 s; one whose
    process burnt more CPU than its threads could (another thread busy) counts its wall time."""
    clocks = {"wall": [0.0, 4.0], "cpu": [0.0, 2.0]}
    monkeypatch.setattr(gemm.time, "perf_counter", lambda: clocks["wall"].pop(0))
    monkeypatch.setattr(gemm.time, "process_time", lambda: clocks["cpu"].pop(0))
    monkeypatch.setattr(gemm.torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(gemm.torch, "mm", lambda a, b, out: None)
    monkeypatch.setattr(gemm, "gemm_libraries", lambda: ("blas",))
    out = perf.measure_peak_flops(sizes=(8,), repeats=1, warmup=0)
    assert out["per_size"][8] == 2 * 8 ** 3 / 1.0 and out["per_size_wall"][8] == 2 * 8 ** 3 / 4.0
    clocks.update(wall=[0.0, 1.0], cpu=[0.0, 6.0])
    out = perf.measure_peak_flops(sizes=(8,), repeats=1, warmup=0)
    assert out["per_size"][8] == out["per_size_wall"][8] == 2 * 8 ** 3 / 1.0


def test_mfu():
    assert perf.mfu(50.0, 2.0, 100.0) == 0.25
    with pytest.raises(ValueError, match="seconds > 0"):
        perf.mfu(1.0, 0.0, 1.0)
