"""The whole check: the parts in turn, the rows finished (MFU against the higher GEMM peak reading,
speedups) and written with the result tables' metadata as OUT/device_check.json."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grlib.probes.device_check as package
from grlib.probes.device_check.attention import correctness, gemm_peak
from grlib.probes.device_check.base import GPU, INTERPRET, INTERPRETED, OUTPUT, TRAIN_SCALE, Run, hardware, versions
from grlib.probes.device_check.kernels import kernels
from grlib.probes.device_check.train import train


def finish_rows(run: Run) -> None:
    """MFU against the higher GEMM peak reading, the speedups of the training rows, the metadata."""
    import math as m

    peak = max(run.gemm) if run.gemm else m.nan
    ref = next((r for r in run.rows if r["table"] == "bench_train" and r["attention_impl"] == "reference"), None)
    for r in run.rows:
        if r["table"] == "bench_train":
            r["peak_flops"], r["peak_before"] = peak, run.gemm[0] if run.gemm else m.nan
            r["peak_after"] = run.gemm[1] if len(run.gemm) > 1 else m.nan
            r["mfu"] = r["flops_per_step"] / (r["step_ms"] / 1e3) / peak if run.gemm else m.nan
            r["speedup_vs_reference"] = r["tokens_per_s"] / ref["tokens_per_s"] if ref else m.nan  # tokens per s: the
            r["reference_batch"] = ref["batch"] if ref else None  # reference may run a smaller batch
            r["reference_recompute_layers"] = ref["recompute_layers"] if ref else None
        elif r["dtype"] == "bfloat16":  # the kernels' GEMM peak: bf16 measured here; fp32 rows have none
            r["matmul_peak_gflops"] = peak / 1e9
            r["frac_of_peak"] = r["gflops"] * 1e9 / peak if run.gemm else m.nan
        else:
            r["matmul_peak_gflops"], r["frac_of_peak"] = m.nan, m.nan
        r.setdefault("frac_of_peak_on_cpu", m.nan)


def metadata(run: Run) -> dict:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
        git_rev = rev.stdout.strip() if rev.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        git_rev = "unknown"
    return {"run_id": run.run_id, "git_rev": git_rev, "hardware": json.dumps(hardware(run), sort_keys=True),
            "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def write(run: Run, out: Path, kernels_scale: str) -> Path:
    from grlib import io
    from grlib.config import load_config

    meta, hashes, rows = metadata(run), {}, []
    for r in run.rows:  # a training row's params_hash is its own config's (the preset with its batch)
        scale = TRAIN_SCALE if r["table"] == "bench_train" else kernels_scale
        if scale not in hashes:
            hashes[scale] = load_config(scale).params_hash()
        rows.append({**meta, "params_hash": hashes[scale], "scale": scale, **r})
    doc = {"device": run.device, "interpret": run.interpret, "run_id": run.run_id, "versions": run.versions,
           "parts": run.parts, "checks": run.checks, "gemm_peak_readings": run.gemm, "rows": rows}
    path = out / OUTPUT
    io.atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grlib.probes.device_check",
                                description=package.__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=None, help="folder for device_check.json (default: $OUT)")
    p.add_argument("--kernels-scale", default="laptop", help="the scale the kernel rows go to (default: laptop, "
                   "where the CPU's bench_kernels rows are)")
    args = p.parse_args(argv)
    interpret = os.environ.get(INTERPRET) == "1"
    out = args.out or os.environ.get("OUT")
    if not out:
        print("error: device check: give an output folder (argument or $OUT)", file=sys.stderr)
        return 2
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (grlib.ops.triton.attention)
    import torch

    if not interpret and not torch.cuda.is_available():
        print(f"error: device check: no CUDA device here (torch {torch.__version__}: torch.cuda.is_available() is "
              f"False); on a CPU run it under the Triton interpreter with {INTERPRET}=1", file=sys.stderr)
        return 2
    sizes = INTERPRETED if interpret else GPU
    run = Run(interpret, sizes)
    Path(out).mkdir(parents=True, exist_ok=True)
    run.part("versions", versions, budget=60)
    run.part("correctness", correctness)
    run.part("gemm_peak", gemm_peak)
    run.part("kernels", kernels)
    run.part("train", train)
    run.part("gemm_peak_after", gemm_peak, budget=run.sizes.budgets["gemm_peak"])
    finish_rows(run)
    path = write(run, Path(out), args.kernels_scale)
    bad = {k: v["status"] for k, v in run.parts.items() if v["status"] != "ok"}
    print(f"\ndevice check on {run.device}: {len(run.rows)} rows in {path}; "
          f"{time.monotonic() - run.started:.0f} s; "
          + ("every part ok" if not bad else "not ok: " + ", ".join(f"{k} {v}" for k, v in bad.items())))
    return 1 if "failed" in bad.values() else 0  # a part out of time is said above; its rows so far are kept
