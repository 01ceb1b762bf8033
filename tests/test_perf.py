"""FLOPs accounting (recsys-examples' HSTU formula), the cached peak, MFU."""
from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from grlib import perf
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


@pytest.mark.parametrize("backward", [False, True])
def test_projection_flops_match_torch_flop_counter(backward):
    """The projection term equals what torch counts for the layers' matmuls (attention aside)."""
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
    linear = sum(v for op, v in counts.items() if str(op).split(".")[1] in ("addmm", "mm"))
    lengths = torch.tensor([5, 1, 0, 8])
    N, D, H = CFG.n_heads, CFG.d_model // CFG.n_heads, CFG.d_model
    gemm = CFG.n_layers * float((2 * lengths * 4 * N * D * H + 2 * lengths * N * D * H).sum())
    assert linear == (3 if backward else 1) * gemm


def test_sasrec_counts_and_popularity_refused():
    cfg = ModelConfig(name="sasrec", n_layers=1, n_heads=2, d_model=8)
    assert perf.sequence_flops([4], cfg, backward=False) == 2 * 4 * 4 * 64 + 2 * 2 * 4 * 64 + 4 * 8 * 16 / 2
    with pytest.raises(ValueError, match="popularity"):
        perf.sequence_flops([4], ModelConfig(name="popularity"))


def test_peak_is_measured_once_per_hardware(monkeypatch, tmp_path):
    monkeypatch.setenv("GRLIB_DATA_DIR", str(tmp_path))
    calls = []
    monkeypatch.setattr(perf, "measure_peak_flops", lambda: calls.append(1) or {"peak_flops": 1e11, "per_size": {}})
    assert perf.peak_flops() == 1e11 and perf.peak_flops() == 1e11 and len(calls) == 1
    cache = json.loads(perf.cache_path().read_text())
    assert list(cache) == [perf.hardware_key()]
    monkeypatch.setattr(perf, "hardware_key", lambda: "other-machine")
    perf.peak_flops()
    assert len(calls) == 2 and len(json.loads(perf.cache_path().read_text())) == 2
    perf.peak_flops(refresh=True)
    assert len(calls) == 3


def test_measured_peak_is_a_real_gemm_rate():
    out = perf.measure_peak_flops(sizes=(128, 256), repeats=2, warmup=1)
    assert out["peak_flops"] == max(out["per_size"].values()) > 1e8  # even a slow CPU beats 0.1 GFLOP/s


def test_mfu():
    assert perf.mfu(50.0, 2.0, 100.0) == 0.25
    with pytest.raises(ValueError, match="seconds > 0"):
        perf.mfu(1.0, 0.0, 1.0)
