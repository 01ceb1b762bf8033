"""grlib.distributed.schedules: the lockstep worker (grlib.train.prefetch.PrefetchWorker, shared with one process), and on 2 gloo ranks with a row-sharded item table:
prefetch and semisync(0) train bit for bit what sync trains for 50 steps (the GEMM library pinned);
semisync(2) looks rows up early (a nonzero stale fraction) and still trains; the one-backward rule."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from grlib.config import ConfigError, DistConfig, load_config
from grlib.distributed.launch import launch
from grlib.train.prefetch import PrefetchError, PrefetchWorker


def _signalled(started: list[int]):
    """fn for a PrefetchWorker: records the item it starts and releases a semaphore per item."""
    done = threading.Semaphore(0)

    def fn(i):
        started.append(i)
        done.release()
        return i * i
    return fn, done


def _await(done: threading.Semaphore, n: int) -> None:
    """Waits until the worker ran fn on n more items. The timeout only turns a hang into a failure:
    nothing here asserts how long the worker took."""
    for _ in range(n):
        assert done.acquire(timeout=60), "the worker did not start the items it may start"


def test_the_worker_runs_at_most_ahead_items_beyond_those_taken():
    """Events, not sleeps: the worker starts `depth` items before any is taken (waited for through
    fn's semaphore), and close() lets it finish what it was allowed and no more, so the items it ran
    by then are exactly taken + depth (it never started one beyond)."""
    started = []
    fn, done = _signalled(started)
    worker = PrefetchWorker(range(10), fn, depth=2)
    _await(done, 2)  # nothing taken yet: it ran 2 ahead
    worker.close()
    assert started == [0, 1]  # and not a third
    started = []
    fn, done = _signalled(started)
    worker = PrefetchWorker(range(10), fn, depth=2)
    assert next(worker) == (0, 0)
    _await(done, 3)  # one taken: a third
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
# the GEMM library of the ranks' float32 linears (grlib.ops.gemm_choice, which otherwise takes the one
# that was faster when this session measured them): pinned, so that the bit-for-bit comparisons below
# cannot depend on a timing (the libraries round differently, and MKL's rounding changes with memory
# alignment)
PINNED_GEMM = {"GRLIB_GEMM": "onednn" if torch.backends.mkldnn.is_available() else "blas"}


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
        run_cfg = cfg.replace({"dist.world": 2, "dist.balance": "kk", "dist.items": "flat", "dist.schedule": schedule,
                               "dist.staleness": k})
        fit = train(model, data, run_cfg, runtime=runtime)
        out[(schedule, k)] = {"losses": fit.losses, "stale": [r["stale_fraction"] for r in fit.timeline]}
    from grlib.ops import gemm_choice

    out["gemm"] = gemm_choice.record()["library"]  # the library the ranks' linears ran: the pinned one
    return out


def test_prefetch_and_semisync0_train_what_sync_trains_bit_for_bit():
    from grlib.data.catalog import load_dataset

    load_dataset(load_config("smoke"), "scale")  # prepared once, before the ranks read it
    got = launch(_train_each_schedule, 2, timeout_s=600, env=PINNED_GEMM)
    assert [g["gemm"] for g in got] == [PINNED_GEMM["GRLIB_GEMM"]] * 2
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


# The modules that call .backward() to measure, never in a training step: one layer or the loss alone
# (kernels, calibrations, the negatives ablation's memory), bench ops' timing, the device check's kernels
# (correctness and timings; its training steps are TrainStep's) and the timing of a linear layer
# through each GEMM library (gemm_choice)
MEASURING_BACKWARDS = {"grlib/experiments/negatives_stage.py", "grlib/experiments/kernels_stage.py",
                       "grlib/experiments/scaling/cluster.py", "grlib/distributed/cost.py",
                       "grlib/experiments/ops_timing.py", "grlib/probes/device_check/attention.py",
                       "grlib/probes/device_check/kernels.py", "grlib/ops/gemm_choice.py"}
# A training step's backward: it starts in TrainStep (1 and N ranks: the data-parallel step wraps it) and,
# under the pipelined schedule, goes on in the communication stream, which runs the item rows' trips
# back to their owners from the gradients the step's own backward handed over through the rows' hooks
# (grlib.distributed.stream._send_back; tests/test_pipelined_schedule.py): one call each
TRAINING_BACKWARDS = {"grlib/train/step.py": 1, "grlib/distributed/stream.py": 1}


def backward_calls(root: Path) -> dict[str, int]:
    """{module path: number of `.backward(...)` calls in its code} over every module under root/grlib."""
    found = {}
    for path in (root / "grlib").rglob("*.py"):
        calls = [n for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"]
        if calls:
            found[str(path.relative_to(root).as_posix())] = len(calls)
    return found


def _functions(tree: ast.AST) -> dict[str, ast.AST]:
    """{name: node} of the functions and methods in `tree`, methods as Class.method."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            out.update({f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)})
        elif isinstance(node, ast.FunctionDef) and not any(node in c.body for c in ast.walk(tree)
                                                           if isinstance(c, ast.ClassDef)):
            out[node.name] = node
    return out


def test_one_backward_for_a_training_step(tmp_path):
    """A training step's backward runs in the places TRAINING_BACKWARDS names, one call each; every
    other call measures one layer or the loss alone. The stream's call continues the step's backward
    only: it is alone in _send_back, which StreamLookup.send_back alone submits, with the gradient that
    StreamGrads hands it from the rows' hooks (or zeros where none came)."""
    root = Path(__file__).resolve().parents[1]
    found = backward_calls(root)
    assert {k: found.pop(k, 0) for k in TRAINING_BACKWARDS} == TRAINING_BACKWARDS
    assert set(found) <= MEASURING_BACKWARDS, sorted(set(found) - MEASURING_BACKWARDS)
    funcs = _functions(ast.parse((root / "grlib" / "distributed" / "stream.py").read_text()))
    with_backward = [name for name, f in funcs.items()
                     if any(isinstance(n, ast.Attribute) and n.attr == "backward" for n in ast.walk(f))]
    assert with_backward == ["_send_back"]
    submitting = [name for name, f in funcs.items() if name != "_send_back"
                  and any(isinstance(n, ast.Name) and n.id == "_send_back" for n in ast.walk(f))]
    assert submitting == ["StreamLookup.send_back"]
    callers = [name for name, f in funcs.items()
               if any(isinstance(n, ast.Attribute) and n.attr == "send_back" for n in ast.walk(f))]
    assert callers == ["StreamGrads._send_ready"]
    planted = tmp_path / "grlib" / "distributed"  # a second training backward is caught
    planted.mkdir(parents=True)
    (planted / "data_parallel.py").write_text("def step(loss):\n    loss.backward()\n")
    assert backward_calls(tmp_path) == {"grlib/distributed/data_parallel.py": 1}
