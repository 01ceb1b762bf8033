"""The memory tracker (grlib.negatives.memory) and the memory properties of the negative paths."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from grlib.config import NegativesConfig
from grlib.negatives import build_negative_path
from grlib.negatives.memory import PeakMemory, peak_bytes

from test_negatives import Table, make_batch


def test_tracker_counts_live_tensors_made_inside():
    outside = torch.ones(1000, 1000)  # 4 MB made before the region: never counted

    def region():
        a = torch.ones(1000, 1000)  # 4 MB, freed before anything else is made
        del a
        b = torch.ones(500, 1000)  # 2 MB
        c = b[:10]  # a view: no new storage
        return b, c, outside * 1  # + 4 MB while b is alive: the peak

    with PeakMemory() as mem:
        keep = region()
    assert mem.peak_bytes == 6_000_000 and mem.current_bytes == 6_000_000
    del keep
    with PeakMemory() as mem:
        region()
    assert mem.current_bytes == 0


def test_tracker_sees_saved_tensors_and_backward():
    x = torch.randn(1000, 250, requires_grad=True)  # 1 MB, made outside

    def step():
        y = (x * 2).exp()  # exp saves its 1 MB output for backward
        y.sum().backward()  # dy * y (1 MB) while y is still saved, then x.grad (1 MB)

    with PeakMemory() as mem:
        step()
    assert 2_000_000 <= mem.peak_bytes <= 3_000_100  # (+ a few scalars)
    assert mem.current_bytes == 1_000_000 and x.grad is not None  # x.grad outlives the region


def _path_peak(sharing: str, precision: str, P: int, R: int, d: int, V: int = 1000) -> int:
    g = torch.Generator().manual_seed(0)
    user = F.normalize(torch.randn(P, d, generator=g), dim=-1).requires_grad_()
    table = F.normalize(torch.randn(V, d, generator=g), dim=-1).requires_grad_()
    batch = make_batch([P], torch.randint(2, V, (P,), generator=g))
    path = build_negative_path(NegativesConfig(sharing=sharing, n_negatives=R, precision=precision), V)
    return peak_bytes(lambda: path.loss(user, Table(table), batch).backward())


def test_half_precision_halves_the_per_token_rows():
    P, R, d = 1500, 64, 64
    rows = P * R * d * 4  # the looked-up rows in FP32
    fp32, fp16 = _path_peak("per-token", "fp32", P, R, d), _path_peak("per-token", "fp16", P, R, d)
    assert rows <= fp32 <= 1.15 * rows  # the rows dominate the per-token path
    # half precision saves half of the rows and leaves the rest (ids, [P, R] logits and gradients,
    # [P, d] and [V, d] tensors) about as it was
    assert abs((fp32 - rows) - (fp16 - rows / 2)) <= 0.03 * rows


def test_shared_path_never_holds_all_logits():
    P, R, d = 3000, 4096, 32
    peak = _path_peak("shared", "fp32", P, R, d)
    assert peak < 0.25 * P * R * 4  # the [P, R] FP32 logits would be 49 MB; chunks of 4 MB are made
