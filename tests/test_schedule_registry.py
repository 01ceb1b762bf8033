"""The schedule registry (grlib.schedules) is the one list of schedules: the CLI's --schedule choices,
the config's checks, the scaling grid's default and params.yaml's grid, the pipeline model's priced
schedules and the classes all read it; no other grlib file names a schedule. A schedule defined in
this file alone (a plugin: GRLIB_SCHEDULES names this file) trains on 2 ranks through `python -m grlib
train` and is priced by the pipeline model from its declared cost, or refused in one line."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grlib import schedules
from grlib.distributed.schedules import RankSchedule, Sync, rank_schedule
from grlib.schedules import ModelCost, Spec

ROOT = Path(__file__).resolve().parents[1]


class SyncTwin(Sync, schedule="sync-twin"):
    """sync's steps under another name, priced as sync."""


class Unpriced(Sync, schedule="unpriced"):
    """sync's steps with no model cost: the pipeline model refuses it."""


# the plugin hook (grlib.schedules.load_plugin): this file's schedules
GRLIB_SCHEDULES = (
    Spec("sync-twin", model=ModelCost(plan_ahead=False), summary="sync, from a test's plugin file"),
    Spec("unpriced", summary="sync, declaring no model cost"),
)


@pytest.fixture
def registry(monkeypatch):
    """The registry as it is, restored after the test (a plugin registered here stays here)."""
    monkeypatch.setattr(schedules, "_registry", dict(schedules._registry))
    monkeypatch.setattr(schedules, "_loaded", list(schedules._loaded))
    monkeypatch.setattr(RankSchedule, "classes", dict(RankSchedule.classes))
    monkeypatch.delenv(schedules.PLUGINS_ENV, raising=False)
    return schedules


def _train_parser() -> argparse.ArgumentParser:
    from grlib.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_every_list_of_schedules_is_the_registry(registry):
    from grlib.config import ConfigError, DistConfig, ScalingAblation, load_ablation
    from grlib.sim.pipeline import Setup

    names = registry.names()
    assert names[:5] == ("sync", "prefetch", "semisync", "overlap", "pipelined")
    option = next(a for a in _train_parser()._actions if "--schedule" in a.option_strings)
    assert tuple(option.choices) == names  # the CLI
    for name in names:  # the config takes each, and its staleness / buckets by the traits
        spec = registry.get(name)
        assert DistConfig(world=2, schedule=name, staleness=int(spec.stale), bucket_bytes=4096 if spec.bucketed
                          else 25 * 2**20).schedule == name
    with pytest.raises(ConfigError, match=re.escape(f"dist.schedule: 'no-such' is not one of {names}")):
        DistConfig(world=2, schedule="no-such")
    assert ScalingAblation().schedules == list(registry.priced())  # the scaling grid's default
    assert set(load_ablation("scaling").schedules) <= set(registry.priced())  # params.yaml's grid
    for name in registry.priced():  # the pipeline model prices every schedule with a cost
        setup = Setup(name, 1 if registry.get(name).stale else 0)
        assert (setup.overlap_allreduce, setup.sparse_stream) == (registry.get(name).bucketed, registry.get(name).stream)
    for spec in registry.specs():  # each a class of the one family, naming its entry
        assert issubclass(rank_schedule(spec.name), RankSchedule) and rank_schedule(spec.name).schedule_name == spec.name
    from grlib.train.prefetch import SyncSchedule
    one = {n: c.__name__ for n, c in SyncSchedule.one_process_classes.items()}
    assert one == {registry.ONE_PROCESS[False]: "SyncSchedule", registry.ONE_PROCESS[True]: "PrefetchSchedule"}
    assert [s.name for s in registry.specs() if s.one_process] == list(one)


def test_no_other_grlib_file_names_a_schedule():
    """The registry's string is the only one: a string test of a schedule's name elsewhere (== "pipelined",
    in ("semisync", ...)) would not follow a schedule added to the registry."""
    named = [str(p.relative_to(ROOT)) for p in (ROOT / "grlib").rglob("*.py")
             if re.search(r"""["'](pipelined|overlap)["']""", p.read_text())]
    assert named == ["grlib/schedules.py"]


def test_a_plugin_file_registers_schedules_that_the_model_prices_or_refuses(registry, tmp_path):
    from grlib.sim.pipeline import Machine, Setup, StepLoad, simulate
    from grlib.sim.alltoall import Cluster, Link

    registry.load_plugin(__file__)
    assert registry.names()[-2:] == ("sync-twin", "unpriced") and "unpriced" not in registry.priced()
    machine = Machine(Cluster("t", 2, Link(1e-3, 1e-9), Link(1e-3, 1e-9), "test"), streams=False)
    load = StepLoad(np.full((4, 2), 0.05), np.full(2, 1e3), np.full(2, 2e3), 1024, 4e6, 0.01, np.full(2, 100.0))
    twin, sync = (simulate(Setup(s), machine, [load] * 4, warm=1).step_s for s in ("sync-twin", "sync"))
    assert np.array_equal(twin, sync)  # priced by its declared cost: sync's
    with pytest.raises(ValueError, match=r"^the pipeline model cannot price schedule 'unpriced': it declares no "
                                         r"model cost \(grlib.schedules.Spec.model\); priced: \("):
        Setup("unpriced")
    with pytest.raises(ValueError, match="schedule 'sync' is registered already"):
        registry.register(Spec("sync"))
    with pytest.raises(FileNotFoundError, match="GRLIB_SCHEDULES: no such schedule plugin file"):
        registry.load_plugin(tmp_path / "absent.py")
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(ValueError, match="defines no GRLIB_SCHEDULES, a tuple of grlib.schedules.Spec"):
        registry.load_plugin(tmp_path / "empty.py")
    with pytest.raises(ValueError, match=r"^Stray names no schedule"):
        type("Stray", (Sync,), {})(None, None)  # a subclass runs the schedule it names, not its parent's
    with pytest.raises(ValueError, match="schedule 'sync' has a rank class already"):
        type("Again", (Sync,), {}, schedule="sync")
    registry.register(Spec("classless"))
    with pytest.raises(ValueError, match="schedule 'classless' has no RankSchedule class"):
        rank_schedule("classless")


def test_a_schedule_from_this_file_trains_on_two_ranks(tmp_path, isolated_outputs):
    """`python -m grlib train --world 2 --schedule sync-twin` with GRLIB_SCHEDULES naming this file: the
    CLI, the config and both spawned ranks load it, and the run trains (smoke scale, 3 steps)."""
    out = tmp_path / "out.json"
    env = {**os.environ, schedules.PLUGINS_ENV: __file__}  # with isolated_outputs' data and results
    run = subprocess.run([sys.executable, "-m", "grlib", "train", "--scale", "smoke", "--world", "2", "--schedule",
                          "sync-twin", "--max-steps", "3", "--json", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    row = json.loads(out.read_text())
    assert (row["world"], row["steps"]) == (2, 3) and np.isfinite(row["final_loss"])
    bad = subprocess.run([sys.executable, "-m", "grlib", "train", "--scale", "smoke", "--world", "2", "--schedule",
                          "sync-twin", "--max-steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={k: v for k, v in env.items() if k != schedules.PLUGINS_ENV})
    assert bad.returncode == 2 and "invalid choice: 'sync-twin'" in bad.stderr  # without the plugin: refused
