"""Progress when stderr is not a terminal: periodic one-line logs (GRLIB_PROGRESS_INTERVAL), a last
line for work that logged, nothing for short work, nothing at all under GRLIB_PROGRESS=0. The
seconds come from a fake clock (grlib.progress.clock): the lines expected do not depend on how
fast this machine runs the loop."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grlib import progress


class FakeClock:
    """grlib.progress.clock's stand-in: the time only moves when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(progress, "clock", fake)
    return fake


@pytest.fixture
def log_mode(monkeypatch, clock):
    monkeypatch.delenv("GRLIB_PROGRESS", raising=False)  # stderr is captured by pytest: not a terminal
    monkeypatch.setenv("GRLIB_PROGRESS_INTERVAL", "0")
    assert progress.mode() == "log"
    return clock


def test_log_lines_at_each_interval_and_at_the_end(log_mode, capsys):
    with progress.bar(4, desc="train", initial=1) as b:
        for _ in range(3):
            log_mode.tick(2.0)  # one step: 2 s
            b.update(1)
            b.set_postfix(loss="2.500", refresh=False)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["train: 2/4 (50%) in 00:02, 2.00s/it, 00:04 left",
                     "train: 3/4 (75%) in 00:04, 2.00s/it, 00:02 left, loss=2.500",
                     "train: 4/4 (100%) in 00:06, 2.00s/it, loss=2.500",
                     "train: 4/4 (100%) in 00:06, 2.00s/it, finished, loss=2.500"]


def test_a_run_of_a_grid_names_itself_in_its_lines(log_mode, capsys):
    """A long command's runs (the train stage's grid, bench negatives' seeds): "run i of n (what): ..."."""
    with progress.run_of(3, 18, "ml-100k sasrec seed 1"):
        with progress.bar(2, desc="train") as b:
            log_mode.tick(1.0)
            b.update(2)
        assert list(progress.progress(range(1), desc="eval")) == [0]
    assert list(progress.progress(range(1), desc="after")) == [0]  # outside the block: as before
    run = "run 3 of 18 (ml-100k sasrec seed 1): "
    assert capsys.readouterr().err.splitlines() == [
        f"{run}train: 2/2 (100%) in 00:01, 2.00it/s", f"{run}train: 2/2 (100%) in 00:01, 2.00it/s, finished",
        f"{run}eval: 1/1 (100%) in 00:00, ?it/s", f"{run}eval: 1/1 (100%) in 00:00, ?it/s, finished",
        "after: 1/1 (100%) in 00:00, ?it/s", "after: 1/1 (100%) in 00:00, ?it/s, finished"]


def test_iterables_and_stopped_work(log_mode, capsys):
    assert list(progress.progress(range(3), desc="rows")) == [0, 1, 2]
    assert list(progress.progress(iter("ab"), desc="gen")) == ["a", "b"]
    with progress.bar(10, desc="cut") as b:
        b.update(2)
    err = capsys.readouterr().err.splitlines()
    rows, gen, cut = ([line for line in err if line.startswith(d + ": ")] for d in ("rows", "gen", "cut"))
    assert [line.split(" in ")[0] for line in rows] == ["rows: 1/3 (33%)", "rows: 2/3 (67%)", "rows: 3/3 (100%)",
                                                        "rows: 3/3 (100%)"] and rows[-1].endswith("finished")
    assert [line.split(" in ")[0] for line in gen] == ["gen: 1", "gen: 2", "gen: 2"] and gen[-1].endswith("finished")
    assert len(cut) == 2 and cut[-1].startswith("cut: 2/10 (20%)") and cut[-1].endswith("stopped")


def test_short_work_is_silent_and_the_interval_is_honoured(monkeypatch, clock, capsys):
    monkeypatch.delenv("GRLIB_PROGRESS", raising=False)
    monkeypatch.setenv("GRLIB_PROGRESS_INTERVAL", "2")
    with progress.bar(100, desc="quick") as b:
        clock.tick(1.5)  # under the interval, to the end
        b.update(50)
    assert capsys.readouterr().err == ""
    with progress.bar(100, desc="slow") as b:
        for _ in range(10):
            clock.tick(0.5)  # a line once 2 s passed since the last: at 2 s and 4 s, then the last at 5 s
            b.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(", ")[0] for line in lines] == ["slow: 4/100 (4%) in 00:02", "slow: 8/100 (8%) in 00:04",
                                                        "slow: 10/100 (10%) in 00:05"], lines
    assert lines[-1].endswith(", stopped") and not any("stopped" in line for line in lines[:-1])


def test_silenced_and_forced(monkeypatch, capsys):
    monkeypatch.setenv("GRLIB_PROGRESS", "0")
    monkeypatch.setenv("GRLIB_PROGRESS_INTERVAL", "0")
    with progress.bar(3, desc="x") as b:
        b.update(3)
    progress.log("a line")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("GRLIB_PROGRESS", "1")
    assert progress.mode() == "bar"
    for bad, var in (("yes", "GRLIB_PROGRESS"), ("-1", "GRLIB_PROGRESS_INTERVAL"), ("nan", "GRLIB_PROGRESS_INTERVAL")):
        monkeypatch.setenv("GRLIB_PROGRESS", "log")
        monkeypatch.setenv(var, bad)
        with pytest.raises(progress.ProgressSettingError, match=var):
            progress.bar(3) if var == "GRLIB_PROGRESS" else progress.interval()
        monkeypatch.setenv("GRLIB_PROGRESS_INTERVAL", "0")


def test_train_cli_logs_progress_when_stderr_is_a_pipe(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GRLIB_PROGRESS"}
    env.update(GRLIB_DATA_DIR=str(tmp_path / "data"), GRLIB_RESULTS_DIR=str(tmp_path / "results"),
               GRLIB_PROGRESS_INTERVAL="0")
    proc = subprocess.run([sys.executable, "-m", "grlib", "train", "--scale", "smoke", "--max-steps", "3"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    train_lines = [line for line in proc.stderr.splitlines() if line.startswith("train: ")]
    assert [line.split(" in ")[0] for line in train_lines] == ["train: 1/3 (33%)", "train: 2/3 (67%)",
                                                               "train: 3/3 (100%)", "train: 3/3 (100%)"]
    assert "loss=" in train_lines[0] and "finished" in train_lines[-1]
