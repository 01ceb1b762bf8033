"""grlib.distributed.data_parallel: the ranks' plans partition the global batch (tokens, negatives, dropout
words), and 2 gloo processes train the model one process trains (losses within 1e-5 for 20 steps,
balancing off and on; evaluation identical), resume exactly from per-rank checkpoints, and stop
when the ranks read different data. `train --world 2` and torchrun run the same code."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib.config import NegativesConfig
from grlib.distributed.data_parallel import Planner, RankMismatch, check_same_batch
from grlib.distributed.launch import RankFailed, launch
from grlib.jagged import JaggedBatch
from grlib.model.dropout import fast_dropout, global_rows
from grlib.negatives import build_negative_path

LOSS_TOL = 1e-5  # float32 sums in another order (per-rank partial sums, then the all-reduce)


def make_batch(lengths: list[int], seed: int = 0) -> JaggedBatch:
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    targets = torch.randint(0, 50, (T,), generator=g) * (torch.rand(T, generator=g) < 0.7)  # some 0 = no target
    return JaggedBatch(item_ids=torch.randint(1, 50, (T,), generator=g), actions=torch.zeros(T, dtype=torch.int64),
                       timestamps=torch.arange(T), offsets=torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64),
                       max_len=max(lengths, default=1), targets=targets)


lengths_st = st.lists(st.integers(0, 12), min_size=0, max_size=14)


@given(lengths=lengths_st, world=st.integers(1, 4), balance=st.sampled_from(["none", "random", "snake", "lpt", "kk"]),
       sharing=st.sampled_from(["per-token", "shared"]))
def test_plans_of_all_ranks_partition_the_global_batch(lengths, world, balance, sharing):
    batch = make_batch(lengths)
    cfg = NegativesConfig(n_negatives=5, sharing=sharing)
    whole = build_negative_path(cfg, 50, seed=3).sample(batch)  # what one process draws
    plans = [Planner(build_negative_path(cfg, 50, seed=3), r, world, balance)(make_batch(lengths))
             for r in range(world)]
    index = torch.cat([p.token_index for p in plans])  # every global token exactly once
    assert sorted(index.tolist()) == list(range(batch.num_tokens))
    for p in plans:
        assert torch.equal(p.local.item_ids, batch.item_ids[p.token_index])
        assert torch.equal(p.local.targets, batch.targets[p.token_index])
        s = p.local.attachments["negatives"].sample
        at = torch.searchsorted(whole.keep, p.token_index[s.keep])  # the global rows of the local targets
        assert torch.equal(whole.keep[at], p.token_index[s.keep])
        assert torch.equal(s.ids, whole.ids if whole.shared else whole.ids[at])
        assert torch.equal(s.targets, whole.targets[at])
    assert sum(p.weight for p in plans) == pytest.approx(1.0 if whole.targets.numel() else 0.0)
    assert len({tuple(p.fingerprint.tolist()) for p in plans}) == 1
    assert all(np.array_equal(p.loads, plans[0].loads) for p in plans)  # one assignment, seen by all


@given(lengths=lengths_st, world=st.integers(1, 3))
def test_dropout_under_global_rows_draws_the_global_masks(lengths, world):
    T, d = sum(lengths), 8
    x = torch.randn(T, d)
    torch.manual_seed(5)
    whole = fast_dropout(x, 0.3)
    after = torch.get_rng_state()
    owner = np.arange(T) % world
    for r in range(world):
        index = torch.from_numpy(np.flatnonzero(owner == r))
        torch.manual_seed(5)
        with global_rows(T, index):
            part = fast_dropout(x[index], 0.3)
        assert torch.equal(part, whole[index])
        assert torch.equal(torch.get_rng_state(), after)  # the generator moves as on one process


@pytest.mark.parametrize("balance", ["none", "kk"])
def test_two_ranks_train_what_one_process_trains(single_run, balance, dp_smoke):
    from grlib.fit import fit_rank

    cfg = dp_smoke().replace({"dist.world": 2, "dist.balance": balance})
    got = launch(fit_rank, 2, args=(cfg, "scale", None, 0, False))
    assert got[0]["losses"] == got[1]["losses"]  # every rank reports the global loss
    losses = got[0]["losses"]
    assert len(losses) == len(single_run.losses) == 20
    assert np.max(np.abs(np.subtract(losses, single_run.losses))) <= LOSS_TOL
    for k in ("test_ndcg@10", "test_hr@10", "test_mrr", "val_ndcg@10"):
        assert got[0]["row"][k] == pytest.approx(single_run.row[k], abs=1e-6), k
    assert got[0]["row"]["world"] == 2 and got[0]["row"]["balance"] == balance
    assert 0.0 < got[0]["row"]["allreduce_fraction"] < 1.0


def test_per_rank_checkpoints_resume_exactly(single_run, tmp_path, dp_smoke):
    from grlib.fit import fit_rank

    ckpt = str(tmp_path / "ckpt")
    dist = {"dist.world": 2, "dist.balance": "lpt"}
    launch(fit_rank, 2, args=(dp_smoke(8).replace(dist), "scale", ckpt, 4, False))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.rank0-of-2.pt", "last.rank1-of-2.pt"]
    got = launch(fit_rank, 2, args=(dp_smoke(20).replace(dist), "scale", ckpt, 4, False))
    assert got[0]["row"]["resumed_from"] == 8
    assert np.max(np.abs(np.subtract(got[0]["losses"], single_run.losses))) <= LOSS_TOL


def _read_with_rank_seed(runtime):
    """Each rank plans a batch of its own: the fingerprint check must stop them."""
    batch = make_batch([3, 1, 4] if runtime.topology.rank == 0 else [3, 1, 5])
    plan = Planner(build_negative_path(NegativesConfig(n_negatives=2), 50), runtime.topology.rank, 2)(batch)
    check_same_batch(plan.fingerprint, runtime.world_group)


def test_ranks_that_read_different_data_stop_with_an_error():
    with pytest.raises(RankFailed, match="RankMismatch|different global batches"):
        launch(_read_with_rank_seed, 2, timeout_s=60)
    assert RankMismatch.__doc__


def test_train_command_with_world_2_records_the_layout(tmp_path, isolated_outputs):
    from grlib.cli import main

    out = tmp_path / "out.json"
    assert main(["train", "--scale", "smoke", "--world", "2", "--balance", "kk", "--max-steps", "3",
                 "--json", str(out)]) == 0
    row = json.loads(out.read_text())
    assert (row["world"], row["nodes"], row["balance"], row["steps"]) == (2, 1, "kk", 3)


def test_train_command_refuses_a_bad_layout(capsys):
    from grlib.cli import main

    assert main(["train", "--scale", "smoke", "--world", "3", "--nodes", "2"]) == 2
    assert "dist.nodes" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--balance", "kk"], ["--schedule", "semisync", "--staleness", "1"],
                                   ["--items", "flat"], ["--cost", "tokens"], ["--nodes", "2"]])
def test_one_process_refuses_the_data_parallel_flags_it_would_not_read(capsys, flags):
    from grlib.cli import main

    assert main(["train", "--scale", "smoke", *flags]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--world is 1" in lines[0]
    assert all(f"--{f.lstrip('-')}=" in lines[0] for f in flags if f.startswith("--")) and not out


def test_torchrun_runs_the_train_command(tmp_path, isolated_outputs):
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "-m", "grlib", "train", "--scale", "smoke", "--max-steps", "3", "--balance", "lpt",
                          "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    row = json.loads(out.read_text())
    assert (row["world"], row["balance"], row["steps"]) == (2, "lpt", 3)


@pytest.mark.parametrize("items", ["replicated", "flat"])
def test_a_rank_killed_mid_training_ends_the_run_with_an_error_naming_it(tmp_path, isolated_outputs, items):
    """No hook in the code: rank 1's process is SIGKILLed while the ranks train (with a sharded item
    table: inside all-to-alls); the command must exit (status 1) naming rank 1, leaving no process
    behind, within a bounded time (no hang)."""
    import os
    import signal
    import time

    psutil = pytest.importorskip("psutil", reason="psutil finds the ranks' processes")
    cmd = [sys.executable, "-m", "grlib", "train", "--scale", "smoke", "--world", "2", "--max-steps", "100000",
           "-o", "train.epochs=1000", "--items", items]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120  # only ends a wait for the ranks that would hang
        ranks = []
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = [c for c in psutil.Process(proc.pid).children() if "spawn" in " ".join(c.cmdline())]
            time.sleep(0.2)  # polling for the ranks' processes
        assert len(ranks) == 2, "the two ranks did not start"
        time.sleep(8)  # likely past start-up, the ranks training (either way the command must end naming rank 1)
        assert proc.poll() is None
        victim = sorted(ranks, key=lambda c: c.create_time())[1]  # started second: rank 1
        killed = time.monotonic()
        os.kill(victim.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
        # a liveness bound, not a speed: the command ends (a hang fails) well within a minute
        assert time.monotonic() - killed < 60
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-2000:]
    assert "rank 1" in err
    assert not [c for c in ranks if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_cost_quadratic_is_calibrated_by_the_launcher_and_refused_under_torchrun(capsys):
    from grlib.config import ConfigError, load_config
    from grlib.fit import calibrated

    cfg = load_config("smoke", {"model.name": "hstu", "dist.world": 2, "dist.balance": "kk", "dist.cost": "quadratic"})
    dc = calibrated(cfg).dist
    assert dc.cost == "quadratic" and len(dc.quadratic) == 3 and all(c >= 0 for c in dc.quadratic)
    from grlib.distributed.cost import QuadraticCost

    short, long = QuadraticCost(*dc.quadratic)([16, 64])
    assert long > short  # a layer's pass over a longer sequence takes longer
    assert "--cost quadratic: calibrated" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="torchrun"):
        calibrated(cfg, launcher=False)
    given = cfg.replace({"dist.quadratic": [1e-4, 2e-6, 3e-8]})  # -o dist.quadratic=[c0,a,b]: read, not timed
    assert calibrated(given, launcher=False).dist.quadratic == (1e-4, 2e-6, 3e-8)


class _Launched(Exception):
    pass


@pytest.mark.parametrize("argv", [["--world", "2", "--balance", "kk", "--schedule", "sync"],
                                  ["-o", "dist.world=2", "-o", "dist.balance=kk", "-o", "dist.schedule=sync"],
                                  ["--world", "2", "-o", "dist.balance=kk", "--schedule", "sync"]])
def test_the_dist_section_is_set_by_o_and_by_the_flags_alike(monkeypatch, argv):
    """train's data-parallel flags are shorthands of the `dist` section's fields: the ranks get the same
    cfg.dist either way."""
    import importlib

    from grlib.cli import main

    seen = {}

    def fake_launch(fn, world, **kw):
        seen["fn"], seen["world"], (cfg, *_rest) = fn, world, kw["args"]
        seen["dc"] = cfg.dist
        raise _Launched

    monkeypatch.setattr(importlib.import_module("grlib.distributed.launch"), "launch", fake_launch)
    monkeypatch.setattr(importlib.import_module("grlib.fit"), "load_dataset", lambda cfg, name: None)
    with pytest.raises(_Launched):
        main(["train", "--scale", "smoke", *argv])
    assert seen["fn"].__name__ == "fit_rank" and seen["world"] == 2  # launch runs the entry grlib.fit gives it
    assert (seen["dc"].world, seen["dc"].balance, seen["dc"].schedule) == (2, "kk", "sync")


@pytest.mark.parametrize("argv,named", [(["-o", "dist.balance=kk"], "-o dist.balance=kk"),
                                        (["-o", "dist.quadratic=[1,2,3]"], "-o dist.quadratic=[1, 2, 3]"),
                                        (["--balance", "lpt", "-o", "dist.balance=kk"], "disagree")])
def test_dist_settings_one_process_would_not_read_are_refused_in_one_line(capsys, argv, named):
    from grlib.cli import main

    assert main(["train", "--scale", "smoke", *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
