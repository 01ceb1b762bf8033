"""Disk trust (issue 55): leftovers of a killed run are removed by the next run, `python -m grlib
clean` lists and removes them, a full disk during `data prepare` is one line, and two runs finishing
the same output at the same instant both end cleanly.

Leftovers are made the way a crash makes them: a child process starts a grlib write and kills itself
with SIGKILL half-way (its pid is then dead), so the tests do not spell grlib's temporary names.
"""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from grlib import io
from grlib.cli import main

ROOT = Path(__file__).resolve().parents[1]

# a child that starts a grlib write in argv[1]/argv[2] and is killed by SIGKILL half-way:
# "file": io.atomic_write of a 0-byte temporary (a checkpoint's .last.pt.*.tmp);
# "dir":  io.output_dir with argv[3] bytes in it (a prepared folder's temporary sibling)
KILLED_CHILD = r"""
import os, signal, sys
from pathlib import Path
from grlib import io

folder, name, kind, size = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
if kind == "file":
    io.atomic_write(folder / name, lambda tmp: os.kill(os.getpid(), signal.SIGKILL))
else:
    with io.output_dir(folder / name) as tmp:
        (tmp / "part.bin").write_bytes(b"x" * size)
        os.kill(os.getpid(), signal.SIGKILL)
"""

# a child whose atomic_write waits for a line on stdin before it ends (a live owner)
LIVE_CHILD = r"""
import sys
from pathlib import Path
from grlib import io

io.atomic_write(Path(sys.argv[1]), lambda tmp: tmp.write_text(sys.stdin.readline()))
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def killed_leftover(folder: Path, name: str, kind: str = "file", size: int = 0) -> Path:
    """The temporary path a SIGKILLed grlib write left in `folder` (its owner's pid is dead)."""
    folder.mkdir(parents=True, exist_ok=True)
    before = set(folder.iterdir())
    proc = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(folder), name, kind, str(size)], env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    new = [p for p in set(folder.iterdir()) - before if p.name != name]
    assert len(new) == 1, new
    return new[0]


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- row "kill -9 of data prepare / train" -----------------------------------------------------------

def test_kill9_of_data_prepare_leaves_leftovers_that_the_next_run_removes(tmp_path):
    """`data prepare` killed by SIGKILL once its temporary folders exist (the raw CSV's work folder
    under data/raw, the output's sibling): they stay; the same command again removes them, says so
    on stderr, and writes a complete OUT."""
    data, out = tmp_path / "data", tmp_path / "outs" / "prep"
    cmd = [sys.executable, "-m", "grlib", "data", "prepare", "--dataset", "synthetic", "--scale", "smoke",
           "--out", str(out), "--n-users", "1000", "--length-factor", "0.05", "--bucket-rows", "20000"]
    env = _env(GRLIB_DATA_DIR=str(data), GRLIB_RESULTS_DIR=str(tmp_path / "results"), GRLIB_PROGRESS="log")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path)

    def temps() -> tuple[list[Path], list[Path]]:
        raw = [p for p in (data / "raw").glob(".synthetic*")] if (data / "raw").is_dir() else []
        beside = [p for p in out.parent.glob(f".{out.name}.*")] if out.parent.is_dir() else []
        return raw, beside

    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        raw, beside = temps()
        if raw and beside:
            break
        time.sleep(0.005)
    assert proc.poll() is None, f"prepare ended before its temporary folders were seen: {proc.stderr.read()}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    raw, beside = temps()
    assert raw and beside and not out.exists()  # what a kill -9 leaves

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert temps() == ([], []), temps()
    assert names(out.parent) == ["prep"]
    assert sorted(p.name for p in out.iterdir()) == [io.MARKER, "sequences.parquet", "stats.json", "vocab.parquet"]
    removed = [line for line in again.stderr.splitlines() if "removed" in line and str(proc.pid) in line]
    assert removed, again.stderr  # the sweep names what it removed (and whose it was)


def test_a_killed_checkpoint_write_is_removed_by_the_next_write_in_its_folder(tmp_path):
    """A 0-byte .last.pt.*.tmp of a training run killed mid-save goes at the next save there."""
    from grlib.train import checkpoint

    ckpt = tmp_path / "ckpt"
    leftover = killed_leftover(ckpt, "last.pt")
    assert leftover.name.startswith(".last.pt.") and leftover.stat().st_size == 0
    checkpoint.save(ckpt / "last.pt", {"step": 1})
    assert names(ckpt) == ["last.pt"]


def test_the_sweep_keeps_a_live_owner_and_names_it_does_not_own(tmp_path, monkeypatch, capsys):
    """Only grlib's own temporaries whose owner is gone are removed: a write in progress in another
    process, a user's files with look-alike names and a resumable download stay."""
    monkeypatch.setenv("GRLIB_PROGRESS", "log")
    folder = tmp_path / "f"
    folder.mkdir()
    live = subprocess.Popen([sys.executable, "-c", LIVE_CHILD, str(folder / "b.json")], env=_env(),
                            stdin=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(folder.glob(".b.json.*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        (live_tmp,) = folder.glob(".b.json.*")
        dead = killed_leftover(folder, "a.json")  # (its own sweep keeps the live one)
        own = ["notes.tmp", ".notes.tmp", ".a.json.abc.tmp", ".a.json.grlib-1-x.tmp", "x.grlib-lock.txt",
               "archive.zip.part", dead.name.lstrip(".")]
        for name in own:
            (folder / name).write_text("mine")
        io.atomic_write_text(folder / "c.json", "{}")
        left = set(names(folder))
        assert dead.name not in left and live_tmp.name in left and set(own) <= left
        err = capsys.readouterr().err
        assert dead.name in err and "removed" in err and live_tmp.name not in err
        live.stdin.write("done\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    finally:
        live.kill()
    assert (folder / "b.json").read_text() == "done\n"


def test_a_reused_pid_does_not_keep_a_leftover_alive(tmp_path):
    """A leftover whose pid now names a process started after the leftover was last written (the pid
    was reused, here: this very process) is a leftover all the same."""
    folder = tmp_path / "f"
    dead = killed_leftover(folder, "a.json")
    m = re.search(r"grlib-(\d+)-", dead.name)
    assert m, dead.name
    reused = dead.with_name(dead.name.replace(f"grlib-{m.group(1)}-", f"grlib-{os.getpid()}-"))
    dead.rename(reused)
    os.utime(reused, (time.time() - 3600 * 24 * 365, time.time() - 3600 * 24 * 365))  # older than this process
    mine = folder / reused.name.replace(".a.json.", ".z.json.")
    mine.write_text("")  # the same pid, written now: this process could own it, so it stays
    io.atomic_write_text(folder / "c.json", "{}")
    assert not reused.exists() and mine.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_killed_owner_not_yet_reaped_has_ended(tmp_path):
    """A zombie (killed, its parent has not waited for it yet) answers os.kill(pid, 0): it has ended all the same."""
    folder = tmp_path / "f"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(folder), "a.json", "file", "0"], env=_env())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                break
            time.sleep(0.01)
        assert state == "Z" and len(list(folder.iterdir())) == 1
        io.atomic_write_text(folder / "c.json", "{}")
        assert names(folder) == ["c.json"]
    finally:
        proc.wait(timeout=60)


# --- `python -m grlib clean` -------------------------------------------------------------------------

def _places(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    places = {"data": tmp_path / "data", "results": tmp_path / "results", "cache": tmp_path / "cache",
              "ckpt": tmp_path / "ckpt"}
    monkeypatch.setenv("GRLIB_DATA_DIR", str(places["data"]))
    monkeypatch.setenv("GRLIB_RESULTS_DIR", str(places["results"]))
    monkeypatch.setenv("GRLIB_CACHE_DIR", str(places["cache"]))
    return places


def test_clean_lists_then_removes_leftovers_in_every_place_grlib_writes(tmp_path, monkeypatch, capsys):
    p = _places(tmp_path, monkeypatch)
    leftovers = [
        killed_leftover(p["data"] / "raw", "synthetic", "dir", 300_000),
        killed_leftover(p["data"] / "processed", "smoke", "dir", 20_000),
        killed_leftover(p["results"] / "tables" / "train" / "scale=smoke", "part-1.parquet"),
        killed_leftover(p["ckpt"], "last.pt"),
        killed_leftover(p["cache"], "kuairand-pure", "dir", 1000),
    ]
    part = p["cache"] / "KuaiRand-Pure.tar.gz.part"
    part.write_bytes(b"y" * 5000)
    user = [p["data"] / "raw" / ".synthetic-notes", p["results"] / "tables" / ".keep.tmp", p["ckpt"] / "best.pt"]
    for f in user:
        f.write_text("mine")

    assert main(["clean", "--dry-run", "--path", str(p["ckpt"])]) == 0
    out = capsys.readouterr().out
    for path in leftovers:
        assert path.exists()
        line = next((ln for ln in out.splitlines() if path.name in ln), None)
        assert line is not None, out
        pid = re.search(r"grlib-(\d+)-", path.name).group(1)
        assert pid in line.split(path.name)[0], line  # the owner's pid in its column
    assert "300.0 KB" in next(ln for ln in out.splitlines() if leftovers[0].name in ln)
    part_line = next(ln for ln in out.splitlines() if part.name in ln)
    assert "resum" in part_line and "kept" in part_line
    assert "would remove 5" in out
    for f in user:
        assert f.name not in out

    assert main(["clean", "--path", str(p["ckpt"])]) == 0
    out = capsys.readouterr().out
    assert "removed 5" in out
    assert not any(path.exists() for path in leftovers)
    assert part.exists() and all(f.exists() for f in user)

    assert main(["clean", "--path", str(p["ckpt"])]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_clean_keeps_a_running_write(tmp_path, monkeypatch, capsys):
    p = _places(tmp_path, monkeypatch)
    target = p["results"] / "metrics" / "x.json"
    target.parent.mkdir(parents=True)
    live = subprocess.Popen([sys.executable, "-c", LIVE_CHILD, str(target)], env=_env(), stdin=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(target.parent.glob(".x.json.*")) and time.monotonic() < deadline:
            time.sleep(0.01)
        (tmp,) = target.parent.glob(".x.json.*")
        assert main(["clean"]) == 0
        out = capsys.readouterr().out
        line = next(ln for ln in out.splitlines() if tmp.name in ln)
        assert str(live.pid) in line and "running" in line and "kept" in line
        assert tmp.exists() and "nothing to remove" in out
        live.stdin.write("ok\n")
        live.stdin.flush()
        assert live.wait(timeout=60) == 0
    finally:
        live.kill()
    assert target.read_text() == "ok\n"


def test_clean_is_a_make_target():
    text = (ROOT / "Makefile").read_text()
    phony = [ln for ln in text.splitlines() if ln.startswith(".PHONY:")][0]
    assert "clean-tmp" in phony.split()
    rule = text.split("\nclean-tmp:", 1)[1].split("\n\n", 1)[0]
    assert "-m grlib clean" in rule


# --- disk full during `data prepare` (row "a params.yaml with a syntax error; disk full ...") -------

def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FullParquetWriter(pq.ParquetWriter):
    def write_table(self, *args, **kwargs):  # pass 2: the sequences file
        _no_space()


def _polars_full(*_args, **_kwargs):  # pass 1: polars' streaming sink, as polars reports it
    raise pl.exceptions.ComputeError("failed to write part: No space left on device (os error 28)")


def _polars_full_oserror(*_args, **_kwargs):
    raise OSError("No space left on device (os error 28)")


def _csv_full(path, *_args, **_kwargs):  # the synthetic log's CSV under data/raw
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@pytest.mark.parametrize("where", ["csv", "pass1-polars", "pass1-oserror", "pass2-parquet"])
def test_disk_full_during_prepare_is_one_line_and_leaves_nothing(where, tmp_path, isolated_outputs, monkeypatch,
                                                                 capsys):
    from grlib.data import catalog

    if where == "csv":
        monkeypatch.setattr(catalog, "write_log_csv", _csv_full)
    elif where == "pass1-polars":
        monkeypatch.setattr(pl.LazyFrame, "sink_ipc", _polars_full)
    elif where == "pass1-oserror":
        monkeypatch.setattr(pl.LazyFrame, "sink_ipc", _polars_full_oserror)
    else:
        monkeypatch.setattr(pq, "ParquetWriter", _FullParquetWriter)
    out = tmp_path / "outs" / "prep"
    code = main(["data", "prepare", "--dataset", "synthetic", "--scale", "smoke", "--out", str(out),
                 "--n-users", "200"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    line = lines[0]
    assert "disk is full" in line and str(out) in line, line
    assert re.search(r"needs about [\d.]+ [KMGT]?B", line) and re.search(r"[\d.]+ [KMGT]?B free", line), line
    assert "file system" in line, line
    assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])
    raw = isolated_outputs / "data" / "raw"
    assert not raw.exists() or list(raw.iterdir()) == []


# --- row "two prepare runs finishing the same --out at the same instant" ------------------------------

TRIES = 30
SLOW_RENAME_S = 0.002  # each rename of a finish takes this long: the two finishes overlap


def _finish_many(out: str, worker: int, barrier, results) -> None:
    # a barrier lets two processes go 0.1-1 ms apart, about what a finish takes: each rename made
    # slower (in this child only) has them overlap whatever the machine's load
    rename = os.replace

    def slow_rename(src, dst):
        time.sleep(SLOW_RENAME_S)
        return rename(src, dst)

    os.replace = slow_rename
    failures = []
    for i in range(TRIES):
        try:
            with io.output_dir(Path(out), what="race") as tmp:
                (tmp / "data.txt").write_text(f"try {i}\n")
                barrier.wait(timeout=60)  # both finish at the same instant
        except Exception as err:  # noqa: BLE001  (what the test reports)
            failures.append(f"worker {worker}, try {i}: {type(err).__name__}: {err}")
        barrier.wait(timeout=60)  # both done before the next try
    results.put(failures)


def _two_at_once(target, *args) -> list:
    """Runs target(*args, worker, barrier, results) in two spawned processes that meet at `barrier`;
    the failures both put on `results`."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, w, barrier, results)) for w in range(2)]
    for p in procs:
        p.start()
    failures = [f for _ in procs for f in results.get(timeout=240)]
    for p in procs:
        p.join(timeout=60)
    return failures


@pytest.mark.slow  # two spawned processes import grlib (a few seconds), then 30 aligned finishes
def test_two_runs_finishing_the_same_output_at_once(tmp_path):
    out = tmp_path / "outs" / "prep"
    assert _two_at_once(_finish_many, str(out)) == []
    assert names(out.parent) == ["prep"]  # no temporary, old folder or lock file left
    assert sorted(p.name for p in out.iterdir()) == [io.MARKER, "data.txt"]
    assert (out / "data.txt").read_text() == f"try {TRIES - 1}\n"


def test_a_finish_after_another_run_wrote_the_output_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRLIB_PROGRESS", "log")
    out = tmp_path / "prep"
    with io.output_dir(out, what="prepared sequences") as first:
        (first / "who").write_text("first")
        with io.output_dir(out, what="prepared sequences") as second:  # another run, finishing first
            (second / "who").write_text("second")
        capsys.readouterr()
    assert (out / "who").read_text() == "first"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "another run" in err[0], err
    assert names(tmp_path) == ["prep"]


PREPARE_TRIES = 5


def _prepare_at_once(out: str, data: str, worker: int, barrier, results) -> None:
    os.environ["GRLIB_DATA_DIR"] = data
    os.environ["GRLIB_PROGRESS"] = "0"
    from grlib.config import DataConfig
    from grlib.data import catalog, preprocess

    prepare = preprocess._prepare

    def aligned(*args, **kwargs):  # every source read, the sequences written: finish with the other run
        stats = prepare(*args, **kwargs)
        barrier.wait(timeout=120)
        return stats

    preprocess._prepare = aligned
    rename = os.replace

    def slow_rename(src, dst):  # as in _finish_many: the finishes overlap
        time.sleep(SLOW_RENAME_S)
        return rename(src, dst)

    os.replace = slow_rename
    data = DataConfig(dataset="synthetic", n_users=60, length_factor=0.005, n_items=500, max_len=32)
    failures = []
    for i in range(PREPARE_TRIES):
        try:
            catalog.prepare_to(data, Path(out))
        except Exception as err:  # noqa: BLE001
            failures.append(f"worker {worker}, try {i}: {type(err).__name__}: {err}")
        barrier.wait(timeout=120)
    results.put(failures)


@pytest.mark.slow  # two spawned processes import grlib and polars, then prepare a tiny dataset 5 times each
def test_two_data_prepare_runs_finishing_the_same_out_at_once(tmp_path):
    out = tmp_path / "outs" / "prep"
    assert _two_at_once(_prepare_at_once, str(out), str(tmp_path / "data")) == []
    assert names(out.parent) == ["prep"]
    assert json.loads((out / "stats.json").read_text())["dataset"] == "synthetic"
    assert list((tmp_path / "data" / "raw").iterdir()) == []
