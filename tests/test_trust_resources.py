"""Resource checks before allocation (issue 55, item 5): `python -m grlib train` estimates the memory a
run needs from its config (grlib.train.footprint) and refuses, in one line with exit 2, a config whose
estimate exceeds the free memory, before the model is built (and, where the config alone shows it,
before any data is prepared), unless --force.

The table row: `-o data.max_len=100000000` with SASRec at smoke scale asked for 25.6 GB (its
positions table, 1e8 x 64 floats) and died with a traceback (exit 1).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from grlib.cli import main
from grlib.config import ConfigError, load_config

SMOKE = ["train", "--scale", "smoke", "--max-steps", "1"]
HUGE_MAX_LEN = "data.max_len=100000000"
# the refused run's child: address space capped so that, whatever the code does, it cannot take the
# machine's memory (the unchanged code hit the cap and died with a traceback, exit 1)
CHILD_ADDRESS_SPACE = 8 << 30


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _run_child(args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """`python -m grlib ARGS` in a child with its own data and results folders and a capped address
    space -> (the process, seconds, its peak resident set in MB: VmHWM, written at exit)."""
    peak_file = tmp_path / "peak_rss_kb"
    wrapper = textwrap.dedent(f"""
        import atexit, resource, runpy, sys
        resource.setrlimit(resource.RLIMIT_AS, ({CHILD_ADDRESS_SPACE}, {CHILD_ADDRESS_SPACE}))
        def _peak():
            with open("/proc/self/status") as fh:
                kb = next(line.split()[1] for line in fh if line.startswith("VmHWM:"))
            with open({str(peak_file)!r}, "w") as out:
                out.write(kb)
        atexit.register(_peak)
        sys.argv = ["grlib", *{args!r}]
        runpy.run_module("grlib", run_name="__main__", alter_sys=True)
    """)
    env = {**os.environ, "GRLIB_DATA_DIR": str(tmp_path / "data"), "GRLIB_RESULTS_DIR": str(tmp_path / "results")}

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", wrapper], env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    peak_mb = int(peak_file.read_text()) / 1024 if peak_file.exists() else float("nan")
    return proc, seconds, peak_mb


def test_max_len_1e8_sasrec_is_refused_in_one_line_before_allocating(tmp_path):
    """The table row: refused with exit 2 in one line naming the estimate, its main term, the free
    memory and --force; quickly, with a small peak resident set, and before any data is prepared."""
    proc, seconds, peak_mb = _run_child(["train", "--scale", "smoke", "--model", "sasrec", "-o", HUGE_MAX_LEN],
                                        tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = _one_error_line(proc.stderr)
    assert "data.max_len=100000000" in line and "SASRec" in line and "free" in line and "--force" in line, line
    assert seconds < 60, seconds  # ~5 s on the 2-core machine: imports, then the check
    assert peak_mb < 1024, peak_mb  # the interpreter and torch, no model (0.28 GB measured)
    assert not (tmp_path / "data" / "processed").exists()  # refused on the config alone: nothing prepared


def test_estimate_of_a_tiny_sasrec_matches_hand_computed_terms():
    from grlib.model import preset_parameters
    from grlib.train import footprint

    cfg = load_config("smoke", {"model.name": "sasrec", "model.d_model": 8, "model.n_heads": 2, "model.n_layers": 1,
                                "data.max_len": 16, "train.batch_size": 4, "train.eval_batch_size": 5,
                                "negatives.n_negatives": 3})
    V = 102  # 100 items + pad + OOV
    est = footprint.estimate(cfg, footprint.DataShape(n_items=V, longest=10, events=1000))
    B, N, d, H, R, Be = 4, 16, 8, 2, 3, 5
    terms = {t.name: t.bytes for t in est.terms}
    # tables: value, gradient and Adam's two moments in fp32 (lazy Adam: also a float64 step per row)
    assert terms["item table"] == 4 * 4 * V * d + 8 * V
    assert terms["SASRec positions table"] == 4 * 4 * N * d
    dense = preset_parameters(cfg.model, V, N).dense - N * d  # the layers, the action/gap tables, norms
    assert terms["dense weights"] == 4 * 4 * dense
    # SASRec pads every sequence to data.max_len: one layer's attention holds [B, H, N, N] floats
    assert terms["SASRec attention"] == footprint.SASREC_SCORE_BYTES * B * H * N * N * 1
    assert terms["SASRec causal mask"] == N * N * (1 + 4)
    assert terms["SASRec activations"] == footprint.SASREC_TOKEN_FLOATS * 4 * B * N * d * 1
    assert terms["negatives (per-token)"] == B * 10 * R * (4 * d + footprint.NEGATIVE_ID_BYTES)
    assert terms["evaluation scores"] == Be * V * footprint.SCORE_BYTES + 4 * V * d
    assert terms["SASRec evaluation attention"] == footprint.SASREC_EVAL_SCORE_BYTES * Be * H * N * N
    assert terms["data"] == 1000 * footprint.EVENT_BYTES
    assert terms["runtime"] == footprint.RUNTIME_BYTES
    assert est.per_process == sum(terms.values()) and est.total == est.per_process


@pytest.mark.parametrize("name", ["hstu", "sasrec"])
def test_estimated_parameters_are_the_models(name):
    """The tables and weights the estimate counts are the built model's parameters (meta device)."""
    from grlib.model import preset_parameters
    from grlib.train import footprint

    for scale in ("smoke", "laptop", "paper"):
        cfg = load_config(scale, {"model.name": name})
        count = preset_parameters(cfg.model, 5000, cfg.data.max_len)
        assert footprint.parameter_count(cfg, 5000) == (count.dense, count.embedding), scale


def test_the_hstu_estimate_leaves_out_lengths_it_does_not_know():
    """Before the data is read, HSTU's jagged activations are unknown (its windows are the data's
    lengths, not data.max_len): the estimate is a lower bound that max_len alone cannot inflate."""
    from grlib.train import footprint

    cfg = load_config("smoke", {"data.max_len": 100_000_000})
    assert footprint.estimate(cfg).per_process < 2e9
    known = footprint.estimate(cfg, footprint.DataShape(n_items=502, longest=40, events=10_000))
    assert "HSTU activations" in {t.name for t in known.terms}


def test_batch_tokens_bound_the_longest_windows():
    """T of a batch from stats.json's length quantiles: never below the sum of the batch's longest
    windows (lognormal lengths, as the KuaiRand twin's), tighter than batch x longest."""
    import numpy as np

    from grlib.train.footprint import DataShape

    rng = np.random.default_rng(0)
    for users, max_len in ((50, 64), (294, 512), (4000, 128), (1000, 4096)):
        lengths = np.minimum(rng.lognormal(4.0, 1.0, users).astype(int) + 3, max_len + 2)
        stats = {"items": 10, "users": users, "events": int(lengths.sum()), "length_max": int(lengths.max()),
                 **{f"length_p{round(q * 100)}": float(np.quantile(lengths, q)) for q in (0.5, 0.9, 0.99)}}
        shape = DataShape.from_stats(stats, max_len)
        windows = np.sort(np.minimum(lengths, max_len))
        for batch in (1, 8, 64, 256):
            bound = shape.batch_tokens(batch)
            assert windows[-batch:].sum() <= bound <= min(batch * shape.longest, stats["events"]), (users, batch)
        if max_len == 512:  # few long sequences (the smoke twin at max_len 512): the quantiles tighten it
            assert shape.batch_tokens(64) < 0.7 * 64 * shape.longest


def test_a_smoke_config_fits_and_trains(isolated_outputs, capsys):
    from grlib.train import footprint

    free = footprint.free_memory()
    assert free.bytes > 0 and free.source
    for model in ("hstu", "sasrec"):
        est = footprint.estimate(load_config("smoke", {"model.name": model}),
                                 footprint.DataShape(n_items=502, longest=32, events=20_000))
        assert 0 < est.total < free.bytes, (model, est.total, free)
    assert main([*SMOKE, "--model", "sasrec"]) == 0
    assert "error" not in capsys.readouterr().err


def test_low_free_memory_refuses_in_one_line_and_force_runs(isolated_outputs, capsys, monkeypatch):
    from grlib.train import footprint

    monkeypatch.setattr(footprint, "free_memory", lambda: footprint.FreeMemory(10**6, "MemAvailable"))
    capsys.readouterr()
    # the config alone (no data yet): the tables and the runtime's workspace; nothing prepared
    assert main(SMOKE) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: model.d_model=64, model.n_layers=1: training needs an estimated "), line
    assert "with 1 MB free (MemAvailable)" in line and line.endswith("or pass --force to run anyway"), line
    assert not (isolated_outputs / "data" / "processed").exists()
    assert main([*SMOKE, "--force"]) == 0  # runs, saying the figures once
    err = capsys.readouterr().err
    assert err.count("--force: memory check skipped: training needs an estimated") == 1 and "1 MB free" in err, err
    # the data prepared: the whole estimate, its largest sized term the per-token negatives [T, R, d]
    assert main(SMOKE) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("error: negatives.n_negatives=64, train.batch_size=64, model.d_model=64: training "
                           "needs an estimated "), line
    assert "negatives (per-token) 37.2 MB" in line, line
    with pytest.raises(ConfigError):  # the class the CLI turns into exit 2
        footprint.check(load_config("smoke"), footprint.DataShape(n_items=502, longest=32))


def test_world_n_checks_n_ranks(isolated_outputs, capsys, monkeypatch):
    """`train --world N` starts N processes here: N times a rank's estimate must fit, and a refusal
    comes before any rank starts."""
    from grlib.train import footprint

    cfg = load_config("smoke", {"dist.world": 2})
    one = footprint.estimate(cfg, world=2)
    assert one.processes == 2 and one.total == 2 * one.per_process
    monkeypatch.setattr(footprint, "free_memory",
                        lambda: footprint.FreeMemory(int(one.per_process * 1.5), "MemAvailable"))
    capsys.readouterr()
    assert main([*SMOKE, "--world", "2"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "2 ranks" in line and "--force" in line, line


def test_free_memory_takes_the_tighter_of_meminfo_and_the_cgroup(tmp_path):
    from grlib.train.footprint import free_memory

    proc, sys_cg = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   10000000 kB\n")
    (proc / "self" / "cgroup").write_text("0::/job\n")
    assert free_memory(proc, sys_cg).bytes == 10_000_000 * 1024  # no cgroup files: MemAvailable
    job = sys_cg / "job"
    job.mkdir(parents=True)
    (job / "memory.max").write_text("max\n")
    assert free_memory(proc, sys_cg).source == "MemAvailable"
    # cgroup v2: limit 4 GB, 1.5 GB charged of which 0.5 GB inactive page cache (reclaimable)
    (job / "memory.max").write_text(f"{4 * 10**9}\n")
    (job / "memory.current").write_text(f"{15 * 10**8}\n")
    (job / "memory.stat").write_text(f"anon 1\ninactive_file {5 * 10**8}\n")
    got = free_memory(proc, sys_cg)
    assert got.bytes == 3 * 10**9 and "memory.max" in got.source
    # cgroup v1, the tighter ancestor wins
    (proc / "self" / "cgroup").write_text("4:memory:/a/b\n0::/\n")
    leaf, parent = sys_cg / "memory" / "a" / "b", sys_cg / "memory" / "a"
    leaf.mkdir(parents=True)
    (leaf / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (leaf / "memory.usage_in_bytes").write_text("0\n")
    (parent / "memory.limit_in_bytes").write_text(f"{2 * 10**9}\n")
    (parent / "memory.usage_in_bytes").write_text(f"{5 * 10**8}\n")
    (parent / "memory.stat").write_text(f"total_inactive_file {10**8}\ninactive_file 7\n")
    assert free_memory(proc, sys_cg).bytes == 2 * 10**9 - 4 * 10**8
