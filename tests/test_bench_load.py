"""`bench load`: quiet then loaded rows per wait policy, hogs really running and never left behind.
Structure only: no speed is asserted (the machine running the tests is shared)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from grlib.bench import load as bench_load
from grlib.cli import main
from grlib.experiments import load


def _hogs() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if load.HOG_MARKER in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def test_bench_load_rows_and_no_hog_left(isolated_outputs):
    assert not _hogs()
    out = isolated_outputs / "load.json"
    assert main(["bench", "load", "--scale", "smoke", "--steps", "2", "--warmup", "1", "--hog-seconds", "60",
                 "--peak-sizes", "256", "--json", str(out)]) == 0
    assert not _hogs()
    rows = json.loads(out.read_text())
    assert [(r["wait_policy"], r["condition"]) for r in rows] == [
        ("PASSIVE", "quiet"), ("PASSIVE", "loaded"), ("default", "quiet"), ("default", "loaded")]
    for r in rows:
        assert r["threads"] == torch.get_num_threads() and r["steps"] == 2 and r["peak_sizes"] == "256"
        assert r["grlib_choice"] == (r["wait_policy"] == "PASSIVE")  # what a child of grlib runs with
        assert r["step_ms"] > 0 and r["flops_per_step"] > 0 and r["mfu"] > 0
        assert r["peak_gflops"] == max(r["peak_before_gflops"], r["peak_after_gflops"])
        assert r["peak_gflops"] >= r["peak_wall_gflops"] > 0
        if r["condition"] == "quiet":
            assert r["hogs"] == 0 and r["hog_kind"] == "" and r["hog_cpu_s"] == 0
            assert r["step_ratio"] is None and r["mfu_ratio"] is None
        else:  # the hogs ran through the whole loaded measurement and used CPU
            assert r["hogs"] == 2 and r["hog_kind"] == "python" and r["hog_cpu_s"] > 0
    for quiet, loaded in (rows[0:2], rows[2:4]):
        assert loaded["step_ratio"] == pytest.approx(loaded["step_ms"] / quiet["step_ms"])
        assert loaded["mfu_ratio"] == pytest.approx(loaded["mfu"] / quiet["mfu"])


def test_the_command_offers_every_kind_of_hog():
    assert bench_load.HOG_KINDS == tuple(load.HOG_CODE)


@pytest.mark.parametrize("kind", bench_load.HOG_KINDS)
def test_hogs_are_stopped_when_the_block_fails(kind):
    with pytest.raises(KeyError):
        with load.cpu_hogs(2, 60, kind) as hogs:
            assert len(_hogs()) == 2
            deadline = time.monotonic() + 30  # only ends a wait that would hang: no duration is asserted
            while hogs.cpu_seconds() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # polling: the hogs burn CPU once the scheduler runs them
            assert hogs.cpu_seconds() > 0
            raise KeyError("boom")
    assert not _hogs()


def test_a_hog_that_ends_early_is_refused():
    with load.cpu_hogs(1, 0.2) as hogs:
        # its own 0.2 s bound ends it; the deadline only ends a wait that would hang (no duration is asserted)
        deadline = time.monotonic() + 30
        while hogs.procs[0].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for its exit
        with pytest.raises(RuntimeError, match="ended before the loaded measurement"):
            hogs.cpu_seconds()
    assert not _hogs()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_hog_ends_with_the_process_that_started_it():
    # the child sleeps (60 s) only to outlive its kill below; nothing times it
    code = ("import time; from grlib.experiments import load\n"
            "with load.cpu_hogs(1, 60) as h:\n    print(h.procs[0].pid, flush=True)\n    time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        pid = int(parent.stdout.readline())
        parent.kill()  # no `finally` runs in the parent: the hog has to notice on its own
        parent.wait()
        deadline = time.monotonic() + 30  # only ends a wait that would hang: no duration is asserted
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the hog's exit
        assert _gone(pid)
    finally:
        parent.kill()
        parent.wait()
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGKILL)
