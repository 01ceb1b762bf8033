"""Resume after a kill: a training process SIGKILLed after a checkpoint, resumed from it, gives the
same losses for the following steps as an uninterrupted run (model, optimizers, data order,
dropout and sampler RNG all restored)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grlib.train import checkpoint

ARGS = ["--scale", "smoke", "--model", "hstu", "-o", "train.epochs=200", "-o", "train.max_steps=0",
        "-o", "train.select_best=false", "-o", "train.batch_size=32"]


def _cli(extra: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grlib", "train", *ARGS, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_killed_run_resumes_with_the_same_next_losses(tmp_path):
    env = {**os.environ, "GRLIB_DATA_DIR": str(tmp_path / "data"), "GRLIB_RESULTS_DIR": str(tmp_path / "results"),
           "OMP_NUM_THREADS": "1", "GRLIB_PROGRESS": "0"}
    ckpt = tmp_path / "ckpt"
    victim = _cli(["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"], env)
    deadline = time.time() + 240  # only ends a wait for the checkpoint that would hang: no duration is asserted
    killed_at = 0
    while time.time() < deadline and victim.poll() is None:
        if (ckpt / "last.pt").exists():
            step = checkpoint.load(ckpt / "last.pt")["position"]["step"]
            if step >= 3:
                victim.send_signal(signal.SIGKILL)
                killed_at = step
                break
        time.sleep(0.05)  # polling for the checkpoint
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL, victim.stdout.read()
    state = checkpoint.load(ckpt / "last.pt")  # the last complete checkpoint (maybe later than killed_at)
    k = state["position"]["step"]
    assert k >= killed_at >= 3

    n = k + 3
    resumed = _cli(["--checkpoint-dir", str(ckpt), "--max-steps", str(n), "--losses", str(tmp_path / "r.json")], env)
    straight = _cli(["--max-steps", str(n), "--losses", str(tmp_path / "s.json")], env)
    for proc in (resumed, straight):
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
    r = json.loads((tmp_path / "r.json").read_text())
    s = json.loads((tmp_path / "s.json").read_text())
    assert len(r) == len(s) == n
    assert r[:k] == state["losses"] == s[:k]  # history before the kill
    torch.testing.assert_close(torch.tensor(r[k:]), torch.tensor(s[k:]), rtol=0, atol=0)  # the next steps


def _table_rows(results: Path) -> int:
    import polars as pl

    parts = sorted(results.rglob("train_runs/**/*.parquet"))
    return sum(pl.read_parquet(p).height for p in parts)


def test_a_finished_run_resumed_says_so_in_one_line_and_writes_no_row(isolated_outputs, capsys, monkeypatch):
    """Resuming a checkpoint already at the run's last step trains nothing: one line on stderr, no
    metrics line, no row (a row would read tokens_per_s 0 and mfu nan); a larger budget goes on."""
    from grlib.cli import main

    monkeypatch.setenv("GRLIB_PROGRESS", "0")
    ckpt = isolated_outputs / "ck"
    argv = ["train", "--scale", "smoke", "--max-steps", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    assert main(argv) == 0
    capsys.readouterr()
    results = isolated_outputs / "results"
    rows = _table_rows(results)
    assert rows == 1
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "" and err == (f"{ckpt / 'last.pt'}: the run is finished (step 2 of 2); nothing left to train "
                                 f"(a larger --max-steps or train.epochs goes on)\n"), (out, err)
    assert _table_rows(results) == rows
    assert main([*argv[:4], "3", *argv[5:]]) == 0  # one step more: trained, and its row written
    out, err = capsys.readouterr()
    assert err.startswith(f"resuming from {ckpt / 'last.pt'} at step 2") and "steps=3" in out
    assert _table_rows(results) == rows + 1
