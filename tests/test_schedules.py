"""grlib.distributed.schedules: the lockstep worker (grlib.train.prefetch.PrefetchWorker, shared with one process), and on 2 gloo ranks with a row-sharded item table:
prefetch and semisync(0) train bit for bit what sync trains for 50 steps; semisync(2) looks rows up
early (a nonzero stale fraction) and still trains."""
from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from grlib.config import ConfigError, DistConfig, load_config
from grlib.distributed.launch import launch
from grlib.train.prefetch import PrefetchError, PrefetchWorker


def test_the_worker_runs_at_most_ahead_items_beyond_those_taken():
    started = []
    worker = PrefetchWorker(range(10), lambda i: started.append(i) or i * i, depth=2)
    time.sleep(0.2)
    assert started == [0, 1]  # nothing taken yet: 2 ahead
    assert next(worker) == (0, 0)
    time.sleep(0.2)
    assert started == [0, 1, 2]
    assert [next(worker)[1] for _ in range(3)] == [1, 4, 9]
    worker.close()  # finishes what it was allowed (4 taken + 2 ahead = items 0..5), then stops
    assert started == [0, 1, 2, 3, 4, 5]
    assert not any(t.name == worker.name and t.is_alive() for t in threading.enumerate())


def test_the_worker_ends_and_reports_failures():
    assert [r for _, r in PrefetchWorker(range(4), lambda i: -i, depth=1)] == [0, -1, -2, -3]

    def boom(i):
        if i == 2:
            raise KeyError("bad batch")
        return i

    worker = PrefetchWorker(range(5), boom, depth=3)
    assert [next(worker)[1], next(worker)[1]] == [0, 1]
    with pytest.raises(PrefetchError, match="batch 2: KeyError: 'bad batch'"):
        next(worker)
    with pytest.raises(StopIteration):
        next(worker)
    worker.close()


def test_staleness_needs_the_semisync_schedule():
    with pytest.raises(ConfigError, match="dist.staleness"):
        DistConfig(world=2, schedule="prefetch", staleness=1)
    with pytest.raises(ConfigError, match="dist.schedule"):
        DistConfig(world=2, schedule="async")


SCHEDULES = [("sync", 0), ("prefetch", 0), ("semisync", 0), ("semisync", 2)]


def _train_each_schedule(runtime) -> dict:
    """50 smoke steps per schedule in these ranks (one start-up for all): losses, stale fractions."""
    import torch

    from grlib.data.catalog import load_dataset
    from grlib.model import build_model
    from grlib.fit import train

    cfg = load_config("smoke", {"train.max_steps": 50, "train.epochs": 20, "train.batch_size": 32})
    data = load_dataset(cfg, "scale").data
    out = {}
    for schedule, k in SCHEDULES:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, data.n_items, cfg.data.max_len)
        dist_cfg = DistConfig(world=2, balance="kk", items="flat", schedule=schedule, staleness=k)
        fit = train(model, data, cfg.train, cfg.data.max_len, cfg.negatives, runtime=runtime, dist_cfg=dist_cfg)
        out[(schedule, k)] = {"losses": fit.losses, "stale": [r["stale_fraction"] for r in fit.timeline]}
    return out


def test_prefetch_and_semisync0_train_what_sync_trains_bit_for_bit():
    from grlib.data.catalog import load_dataset

    load_dataset(load_config("smoke"), "scale")  # prepared once, before the ranks read it
    got = launch(_train_each_schedule, 2, timeout_s=600)
    sync = got[0][("sync", 0)]["losses"]
    assert len(sync) == 50 and got[1][("sync", 0)]["losses"] == sync
    for key in (("prefetch", 0), ("semisync", 0)):
        assert got[0][key]["losses"] == sync, key  # bitwise
        assert not any(got[0][key]["stale"])
    stale = got[0][("semisync", 2)]
    assert np.isfinite(stale["losses"]).all() and stale["losses"] != sync
    assert stale["stale"][0] == 0.0 and max(stale["stale"]) > 0.0  # rows of batch 0 are fresh


def test_one_worker_class_runs_ahead_for_every_schedule():
    """Every class in grlib that starts a thread: PrefetchWorker (one process's prefetch schedule and a
    rank's prefetch / semisync / overlap / pipelined schedules all run it) and the pipelined schedule's
    communication stream (grlib.distributed.stream.CommStream, a pool of one thread)."""
    root = Path(__file__).resolve().parents[1] / "grlib"
    starters = set()
    for path in root.rglob("*.py"):
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
                name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
                if name in ("Thread", "ThreadPoolExecutor"):
                    starters.add(f"{path.relative_to(root.parent).with_suffix('')}.{cls.name}".replace("/", "."))
    assert starters == {"grlib.train.prefetch.PrefetchWorker", "grlib.distributed.stream.CommStream"}


# The modules that call .backward() on something other than a training step's loss: measurements of
# one layer or of the loss alone (kernels, calibrations, the negatives ablation's memory), bench ops and
# the timing of a linear layer through each GEMM library (gemm_choice); and the pipelined schedule's
# communication stream, which continues the step's own backward through the item rows' trips (their
# gradients, handed over by the step's backward hooks; tests/test_pipelined_schedule.py)
MEASURING_BACKWARDS = {"grlib/experiments/negatives_stage.py", "grlib/experiments/kernels_stage.py",
                       "grlib/experiments/scaling_cluster.py", "grlib/distributed/cost.py", "grlib/bench/ops.py",
                       "grlib/ops/gemm_choice.py", "grlib/distributed/stream.py"}


def backward_calls(root: Path) -> dict[str, int]:
    """{module path: number of `.backward(...)` calls in its code} over every module under root/grlib."""
    found = {}
    for path in (root / "grlib").rglob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"]
        if calls:
            found[str(path.relative_to(root).as_posix())] = len(calls)
    return found


def test_one_backward_for_a_training_step(tmp_path):
    """A training step runs backward in one place, grlib.train.step.TrainStep (1 and N ranks: the
    data-parallel step wraps it); every other call measures one layer or the loss alone."""
    root = Path(__file__).resolve().parents[1]
    found = backward_calls(root)
    assert found.pop("grlib/train/step.py") == 1
    assert set(found) <= MEASURING_BACKWARDS, sorted(set(found) - MEASURING_BACKWARDS)
    planted = tmp_path / "grlib" / "distributed"  # a second training backward is caught
    planted.mkdir(parents=True)
    (planted / "data_parallel.py").write_text("def step(loss):\n    loss.backward()\n")
    assert backward_calls(tmp_path) == {"grlib/distributed/data_parallel.py": 1}
