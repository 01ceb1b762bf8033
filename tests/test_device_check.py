"""The GPU device check (grlib/probes/device_check/, `make device-check`) run on CPU under the
Triton interpreter (DEVICE_CHECK_INTERPRET=1), with the packages a bare GPU image lacks made
unimportable; its JSON rows appended to result tables by `python -m grlib import-rows`; and its
one-line refusal without CUDA and without that variable."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
HAS_TRITON = importlib.util.find_spec("triton") is not None
ABSENT = ("polars", "altair", "papermill", "dvc", "psutil", "fbgemm_gpu")  # not on the GPU image

# the check as `python -m grlib.probes.device_check`, with ABSENT raising ImportError on import
WITHOUT = textwrap.dedent(f'''
    import importlib.abc, runpy, sys

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {ABSENT!r}:
                raise ImportError(f"{{name}}: not on the GPU image (tests/test_device_check.py)")

    sys.meta_path.insert(0, Absent())
    sys.argv = ["device_check", *sys.argv[1:]]
    runpy.run_module("grlib.probes.device_check", run_name="__main__")
''')


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE_CHECK_INTERPRET", "TRITON_INTERPRET", "OUT")}
    return {**env, **extra}


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed; `make test` (or `pip install -e .[interpret]`) "
                    "installs it to run the device check under the Triton interpreter")
@pytest.mark.slow
def test_the_interpreted_check_runs_without_the_gpu_image_lacks_and_its_rows_import_once(tmp_path):
    out = tmp_path / "device_check"
    proc = subprocess.run([sys.executable, "-c", WITHOUT, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=_env(DEVICE_CHECK_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "device_check.json").read_text())
    assert doc["interpret"] and doc["device"].startswith("cpu (Triton interpreter)")
    assert {k: v["status"] for k, v in doc["parts"].items()} == {
        k: "ok" for k in ("versions", "correctness", "gemm_peak", "kernels", "train", "gemm_peak_after")}
    # fwd and every gradient of each case compared, and the training's first losses
    tensors = {(c["case"], c["tensor"]) for c in doc["checks"]}
    assert {("ragged", t) for t in ("out", "dq", "dk", "dv", "dpos", "dtime")} <= tensors
    assert ("train", "first loss") in tensors and all(c["ok"] for c in doc["checks"])
    assert any(0 in c.get("lengths", []) and 1 in c.get("lengths", []) for c in doc["checks"])  # empty and length 1
    kernels = [r for r in doc["rows"] if r["table"] == "bench_kernels"]
    train = [r for r in doc["rows"] if r["table"] == "bench_train"]
    assert {r["impl"] for r in kernels} == {"reference", "triton"}
    assert {(r["regime"], r["max_len"]) for r in kernels} == {(g, n) for g in ("truncated", "scaled") for n in (32, 64)}
    assert all(r["fwd_bwd_ms"] > 0 and r["speedup_vs_reference"] > 0 for r in kernels)
    assert [(r["attention_impl"], r["recompute_layers"]) for r in train] == [("triton", False), ("reference", True)]
    assert all(r["step_ms"] > 0 and r["mfu"] > 0 and r["scale"] == "paper-cpu" for r in train)
    for r in doc["rows"]:  # the result tables' metadata, the machine named
        assert json.loads(r["hardware"])["device"] == doc["device"] and r["run_id"] == doc["run_id"]

    # python -m grlib import-rows: the rows in the tables with their own metadata, once
    from grlib import results

    env = _env(GRLIB_RESULTS_DIR=str(tmp_path / "results"))
    cmd = [sys.executable, "-m", "grlib", "import-rows", str(out / "device_check.json")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cpu (Triton interpreter)" in done.stdout
    os.environ["GRLIB_RESULTS_DIR"] = env["GRLIB_RESULTS_DIR"]
    try:
        train_table = results.read_table("bench_train", "paper-cpu")
        kernels_table = results.read_table("bench_kernels", "laptop")
    finally:
        del os.environ["GRLIB_RESULTS_DIR"]
    assert train_table.height == 2 and kernels_table.height == 8
    assert set(train_table["run_id"]) == {doc["run_id"]} and set(train_table["device"]) == {doc["device"]}
    assert "table" not in train_table.columns and set(train_table["timestamp"]) == {doc["rows"][0]["timestamp"]}
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 2 and "is there already" in again.stderr and len(again.stderr.splitlines()) == 1


def test_import_rows_refuses_a_file_without_rows_in_one_line(tmp_path):
    bad = tmp_path / "device_check.json"
    bad.write_text(json.dumps({"rows": [{"table": "bench_train"}]}))
    proc = subprocess.run([sys.executable, "-m", "grlib", "import-rows", str(bad)], cwd=ROOT, capture_output=True,
                          text=True, env=_env(GRLIB_RESULTS_DIR=str(tmp_path / "results")), timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {bad}: row 0 lacks run_id")
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "results").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run, not refuse")
def test_without_cuda_and_without_the_variable_it_refuses_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grlib.probes.device_check", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: device check: no CUDA device here") and len(proc.stderr.splitlines()) == 1
    assert "DEVICE_CHECK_INTERPRET=1" in proc.stderr and not (tmp_path / "device_check.json").exists()


def test_a_part_out_of_time_says_so_and_the_next_part_runs():
    import time

    from grlib.probes.device_check.base import INTERPRETED, Run

    run = Run(True, INTERPRETED)
    run.part("slow", lambda r: time.sleep(10), budget=0.3)
    run.part("next", lambda r: "ran")
    assert run.parts["slow"]["status"] == "out of time" and run.parts["slow"]["seconds"] < 5
    assert "out of time after" in run.parts["slow"]["note"]
    assert run.parts["next"] == {"status": "ok", "seconds": run.parts["next"]["seconds"], "note": "ran"}
