"""grlib.distributed.buckets (the `overlap` schedule): the bucket layout; on 2 gloo ranks the bucketed
sums equal GradientSync's bit for bit, a parameter no rank gave a gradient stays None and one that
only some ranks gave one gets their sum (buckets still paired in order when a rank skips one); the
smoke model trains under `overlap` within 1e-5 of one process for 20 steps at 2 ranks (bitwise
equal to sync there, replicated and row-sharded items) and at 4 ranks as 2 nodes x 2, with buckets
launched from backward's hooks before backward ends (the step's own counters); the config field
and train's --schedule overlap."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib.config import ConfigError, DistConfig, load_config
from grlib.distributed.buckets import BUCKET_BYTES, bucket_layout
from grlib.distributed.launch import launch

LOSS_TOL = 1e-5  # as tests/test_data_parallel.py: float32 sums in another order
# the GEMM library of the ranks' float32 linears (grlib.ops.gemm_choice, which otherwise takes the one
# that was faster when this session measured them): pinned, so that the bit-for-bit comparisons below
# cannot depend on a timing (the libraries round differently, and MKL's rounding changes with memory
# alignment)
PINNED_GEMM = {"GRLIB_GEMM": "onednn" if torch.backends.mkldnn.is_available() else "blas"}
SMALL = 16 * 2**10  # bytes: several buckets for the smoke model (287 KB of dense gradients)


@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=20), cap=st.integers(1, 2000),
       halves=st.lists(st.booleans(), min_size=20, max_size=20))
def test_the_layout_covers_every_parameter_once_in_reverse_within_the_cap(sizes, cap, halves):
    params = [torch.nn.Parameter(torch.zeros(n, dtype=torch.float16 if h else torch.float32))
              for n, h in zip(sizes, halves)]
    buckets = bucket_layout(params, cap)
    assert [i for b in buckets for i in b] == list(reversed(range(len(params))))
    for b in buckets:
        assert len({params[i].dtype for i in b}) == 1
        nbytes = sum(params[i].numel() * params[i].element_size() for i in b)
        assert nbytes <= cap or len(b) == 1  # a parameter larger than the cap is alone
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_layout(params, 0)


def _toy_rank(runtime) -> dict:
    """Three parameters: `a` used by both ranks, `b` by rank 0 only, `c` by none; one bucket per
    parameter. Gradients from GradientSync and from BucketedSync on the same backward."""
    from grlib.distributed.buckets import BucketedSync
    from grlib.distributed.data_parallel import GradientSync

    rank = runtime.topology.rank
    torch.manual_seed(0)
    a, b, c = (torch.nn.Parameter(torch.randn(5)) for _ in range(3))
    x = torch.randn(5) + rank

    def backward():
        for p in (a, b, c):
            p.grad = None
        loss = (a * x).sum() ** 2 + ((b * x).sum() if rank == 0 else 0.0)
        loss.backward()
        return loss

    flat = GradientSync([c, a, b], runtime.world_group)
    loss = backward()
    flat_loss, _ = flat(loss)
    want = [None if p.grad is None else p.grad.clone() for p in (a, b, c)]
    sync = BucketedSync([c, a, b], 1, runtime.world_group)  # buckets in the order b, a, c
    sync.arm()
    loss = backward()
    got_loss, figures = sync(loss)
    return {"want": want, "got": [None if p.grad is None else p.grad.clone() for p in (a, b, c)],
            "losses": (flat_loss, got_loss), "figures": figures}


def test_bucketed_sums_equal_the_flat_all_reduce_and_keep_the_none_rule():
    got = launch(_toy_rank, 2, timeout_s=120)
    for r in got:
        assert r["got"][2] is None and r["want"][2] is None  # no rank gave c a gradient
        for want, g in zip(r["want"][:2], r["got"][:2]):
            assert torch.equal(want, g)
        assert r["losses"][0] == r["losses"][1]
        assert r["figures"]["buckets"] == 3
    assert torch.equal(got[0]["got"][1], got[1]["got"][1])  # b: rank 0's gradient on both ranks
    # buckets go out in the order b, a, c: rank 0 launches b and a from backward's hooks (c is never
    # ready); rank 1 never readies b, so it launches all three after backward; they still pair up
    assert (got[0]["figures"]["buckets_in_backward"], got[1]["figures"]["buckets_in_backward"]) == (2, 0)


def _train_schedules(runtime, runs: list[DistConfig], steps: int) -> dict:
    """`steps` smoke steps per dist config in these ranks: losses and the overlap counters per step."""
    from grlib.data.catalog import load_dataset
    from grlib.fit import train
    from grlib.model import build_model

    cfg = _smoke(steps)
    data = load_dataset(cfg, "scale").data
    out = {}
    for i, dc in enumerate(runs):
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, data.n_items, cfg.data.max_len)
        fit = train(model, data, dataclasses.replace(cfg, dist=dc), runtime=runtime)
        keys = ("buckets", "buckets_in_backward", "buckets_done_in_backward", "first_launch_lead_s")
        out[i] = {"losses": fit.losses, **{k: [r.get(k) for r in fit.timeline] for k in keys}}
    return out


def _smoke(steps: int):
    return load_config("smoke", {"train.max_steps": steps, "train.epochs": 5, "train.batch_size": 32})


@pytest.fixture(scope="module")
def one_process() -> list[float]:
    """One process, one thread: the 20 losses the ranks must reproduce."""
    from grlib.data.catalog import load_dataset
    from grlib.fit import train
    from grlib.model import build_model

    cfg = _smoke(20)
    data = load_dataset(cfg, "scale").data  # prepared once, before the ranks read it
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, data.n_items, cfg.data.max_len)
        return train(model, data, cfg).losses
    finally:
        torch.set_num_threads(threads)


def _assert_overlapped(run: dict, steps: int) -> None:
    """Every step: several buckets, at least one launched from backward's hooks before backward ended."""
    assert len(run["buckets"]) == steps and min(run["buckets"]) > 1
    assert min(run["buckets_in_backward"]) >= 1, run["buckets_in_backward"]
    assert min(run["first_launch_lead_s"]) > 0.0


@pytest.mark.slow
def test_two_ranks_overlap_trains_what_one_process_and_sync_train(one_process):
    runs = [DistConfig(world=2, balance="kk", schedule="sync"),
            DistConfig(world=2, balance="kk", schedule="overlap", bucket_bytes=SMALL),
            DistConfig(world=2, balance="kk", schedule="sync", items="flat"),
            DistConfig(world=2, balance="kk", schedule="overlap", bucket_bytes=SMALL, items="flat")]
    got = launch(_train_schedules, 2, args=(runs, 20), timeout_s=600, env=PINNED_GEMM)
    assert got[0][1]["losses"] == got[1][1]["losses"]  # every rank reports the global loss
    overlap = got[0][1]["losses"]
    assert len(overlap) == len(one_process) == 20
    assert np.max(np.abs(np.subtract(overlap, one_process))) <= LOSS_TOL
    assert overlap == got[0][0]["losses"]  # 2 ranks: each sum is a + b in either layout, bit for bit
    assert got[0][3]["losses"] == got[0][2]["losses"]  # the sharded item rows keep their own route
    for r in (0, 1):
        _assert_overlapped(got[r][1], 20)
        _assert_overlapped(got[r][3], 20)
    assert all(b is None for b in got[0][0]["buckets"])  # sync: no buckets


@pytest.mark.slow
def test_four_ranks_on_two_nodes_overlap_trains_what_one_process_trains(one_process):
    runs = [DistConfig(world=4, nodes=2, balance="lpt", schedule="overlap", bucket_bytes=SMALL)]
    got = launch(_train_schedules, 4, nodes=2, args=(runs, 20), timeout_s=600, env=PINNED_GEMM)
    losses = got[0][0]["losses"]
    assert all(g[0]["losses"] == losses for g in got)
    assert np.max(np.abs(np.subtract(losses, one_process))) <= LOSS_TOL
    for g in got:
        _assert_overlapped(g[0], 20)


def test_bucket_bytes_is_read_by_the_overlap_schedule_only():
    assert DistConfig().bucket_bytes == BUCKET_BYTES == 25 * 2**20
    assert DistConfig(world=2, schedule="overlap", bucket_bytes=4096).bucket_bytes == 4096
    with pytest.raises(ConfigError, match=r"^dist.bucket_bytes: is read by dist.schedule 'overlap' and 'pipelined' only"):
        DistConfig(world=2, schedule="prefetch", bucket_bytes=4096)
    with pytest.raises(ConfigError, match=r"^dist.bucket_bytes: must be >= 1"):
        DistConfig(world=2, schedule="overlap", bucket_bytes=0)


def test_train_command_runs_the_overlap_schedule(tmp_path, isolated_outputs, capsys):
    import json

    from grlib.cli import main

    out = tmp_path / "out.json"
    assert main(["train", "--scale", "smoke", "--world", "2", "--schedule", "overlap", "-o",
                 f"dist.bucket_bytes={SMALL}", "--max-steps", "3", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert (row["world"], row["steps"]) == (2, 3) and np.isfinite(row["final_loss"])
    capsys.readouterr()
    assert main(["train", "--scale", "smoke", "--world", "2", "--schedule", "sync", "-o",
                 f"dist.bucket_bytes={SMALL}", "--max-steps", "3"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dist.bucket_bytes: "), lines


def test_the_scaling_stage_measures_and_models_the_overlap_schedule():
    """Its 2-rank runs train `overlap` with the spec's buckets; the pipeline model takes it as prefetch
    with the bucketed all-reduce beside backward (grlib.sim.pipeline.Setup.overlap_allreduce)."""
    from grlib.experiments.scaling.measured import PairSpec, dense_buckets, dist_config
    from grlib.experiments.scaling.validation import model_setup

    spec = PairSpec(8, 64, 2, 1, 1, (("sync", 0), ("overlap", 0)), "kk", "flat", 2, (1024,), 1)
    assert dist_config(spec, 2, "overlap", 0).bucket_bytes == spec.bucket_bytes < BUCKET_BYTES
    assert dist_config(spec, 2, "sync", 0).bucket_bytes == BUCKET_BYTES
    setup = model_setup("overlap", 0, spec, 5)
    assert (setup.program, setup.overlap_allreduce, setup.buckets) == ("prefetch", True, 5)  # prefetch's lanes
    assert not model_setup("sync", 0, spec, 5).overlap_allreduce
    cfg = load_config("laptop")
    assert dense_buckets(cfg, 1000, 64, spec.bucket_bytes) > 1  # something to overlap at the stage's scale
