"""The `pipelined` schedule (grlib.distributed.stream): a sharded table's trips on a communication
stream. On gloo ranks the smoke model trains within 1e-5 of one process for 20 steps at k = 0
(2 ranks, and 4 as 2 nodes x 2), and bit for bit what semisync(1) trains at k = 1; every step sends
the loss rows' gradients from backward's hooks, before backward ends; the gradients' trips go out in
the fixed order whichever hook fires first; the config and `train --schedule pipelined`."""
from __future__ import annotations

import dataclasses
from concurrent.futures import Future

import numpy as np
import pytest
import torch

from grlib.config import DistConfig
from grlib.distributed.launch import launch
from grlib.distributed.stream import StreamGrads
# one_process: the fixture of one process's 20 losses; PINNED_GEMM: the ranks' GEMM library, pinned
from test_overlap_allreduce import PINNED_GEMM, _smoke, one_process  # noqa: F401

LOSS_TOL = 1e-5  # as tests/test_data_parallel.py: float32 sums in another order
SMALL = 16 * 2**10  # bytes: several buckets for the smoke model


def _train(runtime, runs: list[DistConfig], steps: int) -> list[dict]:
    from grlib.data.catalog import load_dataset
    from grlib.fit import train
    from grlib.model import build_model

    cfg = _smoke(steps)
    data = load_dataset(cfg, "scale").data
    out = []
    for dc in runs:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, data.n_items, cfg.data.max_len)
        fit = train(model, data, dataclasses.replace(cfg, dist=dc), runtime=runtime)
        keys = ("stream_grads_in_backward", "buckets_in_backward", "stale_fraction", "lookup_comm_s")
        out.append({"losses": fit.losses, **{k: [r.get(k) for r in fit.timeline] for k in keys}})
    return out


def _assert_streamed(run: dict, steps: int) -> None:
    """Every step: the loss rows' gradients queued from backward's hook, dense buckets too."""
    assert len(run["stream_grads_in_backward"]) == steps
    assert min(run["stream_grads_in_backward"]) >= 1, run["stream_grads_in_backward"]
    assert min(run["buckets_in_backward"]) >= 1, run["buckets_in_backward"]


def test_two_ranks_pipelined_trains_what_one_process_and_semisync_train(one_process):
    runs = [DistConfig(world=2, balance="kk", schedule="pipelined", bucket_bytes=SMALL, items="hierarchical"),
            DistConfig(world=2, balance="kk", schedule="semisync", staleness=1, items="flat"),
            DistConfig(world=2, balance="kk", schedule="pipelined", staleness=1, bucket_bytes=SMALL, items="flat")]
    got = launch(_train, 2, args=(runs, 20), timeout_s=600, env=PINNED_GEMM)
    exact, semisync, stale = got[0]
    assert len(exact["losses"]) == len(one_process) == 20
    assert np.max(np.abs(np.subtract(exact["losses"], one_process))) <= LOSS_TOL
    assert max(exact["stale_fraction"]) == 0.0
    # k = 1: the same rows looked up at the same point as semisync(1), the same sums (2 ranks: a + b)
    assert stale["losses"] == semisync["losses"]
    assert max(stale["stale_fraction"]) > 0.0 and stale["stale_fraction"] == semisync["stale_fraction"]
    for r in range(2):
        _assert_streamed(got[r][0], 20)
        _assert_streamed(got[r][2], 20)


def test_four_ranks_on_two_nodes_pipelined_trains_what_one_process_trains(one_process):
    runs = [DistConfig(world=4, nodes=2, balance="lpt", schedule="pipelined", bucket_bytes=SMALL,
                       items="hierarchical", dedup="node")]
    got = launch(_train, 4, nodes=2, args=(runs, 20), timeout_s=900, env=PINNED_GEMM)
    for g in got:
        assert np.max(np.abs(np.subtract(g[0]["losses"], one_process))) <= LOSS_TOL
        _assert_streamed(g[0], 20)


class _Recorded:
    """A lookup whose gradient trip only records its place in the stream's queue."""

    def __init__(self, name: str, log: list[str]):
        self.name, self.log, self.on_grad = name, log, None

    def send_back(self, grad) -> Future:
        self.log.append(f"{self.name}:{'zeros' if grad is None else float(grad.sum())}")
        done: Future = Future()
        done.set_result(None)
        return done


def test_gradient_trips_go_out_in_the_fixed_order_whatever_the_hooks_order():
    log: list[str] = []
    loss, inputs = _Recorded("loss", log), _Recorded("input", log)
    grads = StreamGrads([loss, inputs])
    inputs.on_grad(torch.ones(2))  # the input rows' hook fires first (say, a rank without targets)
    assert log == []  # held back: the loss rows' trip goes first on every rank
    loss.on_grad(torch.ones(3))
    assert log == ["loss:3.0", "input:2.0"]
    figures = grads.finish()
    assert figures["stream_grads_in_backward"] == 2 and log == ["loss:3.0", "input:2.0"]
    log.clear()
    grads = StreamGrads([_Recorded("loss", log), _Recorded("input", log)])
    assert grads.finish()["stream_grads_in_backward"] == 0  # no hook fired: zeros, still in order
    assert log == ["loss:zeros", "input:zeros"]


def test_pipelined_takes_staleness_and_buckets():
    dc = DistConfig(world=2, schedule="pipelined", staleness=2, bucket_bytes=4096, items="flat")
    assert (dc.staleness, dc.bucket_bytes) == (2, 4096)


def test_train_command_runs_the_pipelined_schedule(tmp_path, isolated_outputs):
    import json

    from grlib.cli import main

    out = tmp_path / "out.json"
    assert main(["train", "--scale", "smoke", "--world", "2", "--schedule", "pipelined", "--staleness", "1",
                 "-o", "dist.items=hierarchical", "--max-steps", "3", "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert (row["world"], row["steps"]) == (2, 3) and np.isfinite(row["final_loss"])
