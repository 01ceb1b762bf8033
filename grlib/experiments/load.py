"""Training step and GEMM peak under a concurrent CPU hog: quiet, then loaded, per OpenMP wait policy.

For each wait policy (default: PASSIVE, grlib's choice, and libgomp's own default) one fresh
subprocess (libgomp reads the policy when it loads) trains the scale's HSTU with the trainer itself
(grlib.train.train: data, forward, loss, backward, optimizer per step), twice:

    quiet    GEMM peak, `--warmup` + `--steps` training steps, GEMM peak (perf.measured_peak)
    loaded   the same while `--hogs` busy processes run (each bounded by --hog-seconds and by the
             life of the process that started it; stopped in a `finally`): pure-Python loops, or
             with --hog-kind torch, torch jobs with torch's default OpenMP settings

Per (policy, condition): the median step, the peak (perf.measure_peak_flops: GEMMs timed by their
on-CPU time; the higher of before and after, measured under the same load as the steps), MFU, and
on the loaded row the ratios loaded / quiet. `wall_peak` / `mfu_wall_peak`: the same from wall
times alone, which the hogs cut by their share of the cores. The targets for grlib's choice: a
loaded step at most 3x the quiet one, a loaded MFU at most 1.10x the quiet one (an MFU that rises
under load means the peak took more of the load than the steps did).
Rows go to the `bench_load` result table (grlib.results).

    python -m grlib bench load --scale smoke              # about a minute on 2 cores
    python -m grlib bench load --scale laptop --steps 6   # a laptop-shaped step
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from grlib import results, threads
from grlib.bench.common import positive_int, print_table
from grlib.config import config_from_args, load_config, parse_overrides

# torch and the trainer are imported in the functions that run them (the child's): the parser
# imports this module, and `bench load --help` answers without torch (tests/test_cli_startup.py)

HOG_MARKER = "grlib-bench-load-hog"
# Busy work that ends after argv[1] seconds, or as soon as the process that started it is gone; it
# says "ready" once it runs. `python`: a pure-Python loop. `torch`: another torch job as a
# co-tenant runs it, with torch's default OpenMP settings: bursts of small parallel matmuls with
# serial gaps between them (where its idle workers spin).
HOG_CODE = {
    "python": f"""# {HOG_MARKER}
import os, sys, time
end, parent = time.monotonic() + float(sys.argv[1]), int(sys.argv[2])
print("ready", flush=True)
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(100_000):
        pass
""",
    "torch": f"""# {HOG_MARKER}
import os, sys, time
import torch
end, parent = time.monotonic() + float(sys.argv[1]), int(sys.argv[2])
a = torch.randn(256, 256)
print("ready", flush=True)
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(50):
        a @ a
    time.sleep(0.001)
""",
}
POLICY_CHOICES = {"passive": "PASSIVE", "active": "ACTIVE", "default": "default"}
CHILD_TIMEOUT_S = 900
STEP_TARGET, MFU_TARGET = 3.0, 1.10  # loaded / quiet, for grlib's choice
COLUMNS = {"policy": "wait_policy", "threads": "threads", "grlib": "grlib_choice", "condition": "condition",
           "step_ms": "step_ms", "peak_GFLOP/s": "peak_gflops", "wall_peak": "peak_wall_gflops", "mfu": "mfu",
           "step_x": "step_ratio", "mfu_x": "mfu_ratio", "load_1m": "loadavg_1m"}


def _policies(text: str) -> list[str]:
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    if not names or any(n not in POLICY_CHOICES for n in names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names from {', '.join(POLICY_CHOICES)}, "
                                         f"got {text!r}")
    return list(dict.fromkeys(POLICY_CHOICES[n] for n in names))


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    return 0 if text.strip() == "0" else positive_int(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=positive_int, default=20, help="timed training steps per condition")
    p.add_argument("--warmup", type=_count, default=3, help="untimed training steps first")
    p.add_argument("--hogs", type=positive_int, default=2, help="busy processes of the loaded condition")
    p.add_argument("--hog-kind", choices=tuple(HOG_CODE), default="python",
                   help="python: pure-Python busy loops; torch: torch jobs with torch's default OpenMP settings")
    p.add_argument("--hog-seconds", type=_seconds, default=120.0,
                   help="upper bound on a hog's life (they are stopped when the loaded measurement ends)")
    p.add_argument("--policies", type=_policies, default="passive,default",
                   help=f"comma-separated OpenMP wait policies, each in a fresh process ({', '.join(POLICY_CHOICES)})")
    p.add_argument("--threads", type=positive_int, nargs="+", default=None,
                   help="torch threads to measure each policy with (default: grlib's, see grlib.threads)")
    p.add_argument("--peak-sizes", type=positive_int, nargs="+", default=None,
                   help="square GEMM sizes of the peak measurement")


class Hogs:
    """Busy processes started by cpu_hogs()."""

    def __init__(self, procs: list[subprocess.Popen]):
        self.procs = procs

    def cpu_seconds(self) -> float:
        """CPU seconds the hogs have used so far; raises if one has already ended (the load was not held)."""
        ended = [p.pid for p in self.procs if p.poll() is not None]
        if ended:
            raise RuntimeError(f"CPU hog(s) {ended} ended before the loaded measurement did: raise --hog-seconds")
        return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in self.procs)


@contextlib.contextmanager
def cpu_hogs(n: int, seconds: float, kind: str = "python") -> Iterator[Hogs]:
    """`n` busy processes of `kind` (HOG_CODE) for at most `seconds`; always terminated (then killed)
    when the block ends. A `torch` hog runs with libgomp's default wait policy, as a plain torch job."""
    procs: list[subprocess.Popen] = []
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.POLICY_ENV)}  # a plain job's settings
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", HOG_CODE[kind], str(seconds), str(os.getpid())],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env))
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"CPU hog {p.pid} ({kind}) did not start (exit {p.wait()})")
        if n:
            time.sleep(0.5)  # running at full speed before anything is timed
        yield Hogs(procs)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.data.catalog import load_dataset
    from grlib.hardware import PEAK_SIZES

    overrides = {**parse_overrides(args.override), "model.name": "hstu"}  # the children rebuild cfg from these
    cfg = config_from_args(args, overrides)
    load_dataset(cfg, "scale")  # prepared once here, not by every child at once
    mine = {"wait_policy": threads.inherited_policy(), "threads": threads.policy()["threads"]}
    spec = {"scale": cfg.scale, "overrides": overrides, "steps": args.steps, "warmup": args.warmup,
            "hogs": args.hogs, "hog_kind": args.hog_kind, "hog_seconds": args.hog_seconds,
            "peak_sizes": args.peak_sizes or list(PEAK_SIZES)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="grlib-bench-load-") as tmp:
        for policy in args.policies:
            for n in dict.fromkeys(args.threads or [mine["threads"]]):
                rows += _run_child({**spec, "policy": policy, "threads": n}, Path(tmp))
    for r in rows:
        r["grlib_choice"] = r["wait_policy"] == mine["wait_policy"] and r["threads"] == mine["threads"]
    _add_ratios(rows)
    print_table([{k: r[v] for k, v in COLUMNS.items()} for r in rows],
                f"bench load: scale {cfg.scale}, HSTU {cfg.model.n_layers}x{cfg.model.n_heads} d={cfg.model.d_model}, "
                f"batch {cfg.train.batch_size} x max_len {cfg.data.max_len}; {args.steps} timed steps per condition, "
                f"loaded = {args.hogs} busy {args.hog_kind} processes; grlib's choice: {mine['wait_policy']}, "
                f"{mine['threads']} threads")
    for r in rows:
        if r["grlib_choice"] and r["condition"] == "loaded":
            print(f"targets ({r['wait_policy']}, {r['threads']} threads): loaded step {r['step_ratio']:.2f}x quiet "
                  f"(<= {STEP_TARGET:g}x: {'met' if r['step_ratio'] <= STEP_TARGET else 'NOT met'}), "
                  f"loaded MFU {r['mfu_ratio']:.2f}x quiet "
                  f"(<= {MFU_TARGET:.2f}x: {'met' if r['mfu_ratio'] <= MFU_TARGET else 'NOT met'})")
    results.append_rows("bench_load", rows, cfg)
    return rows


def _add_ratios(rows: list[dict]) -> None:
    quiet = {(r["wait_policy"], r["threads"]): r for r in rows if r["condition"] == "quiet"}
    for r in rows:
        q = quiet[(r["wait_policy"], r["threads"])]
        loaded = r["condition"] == "loaded"
        r["step_ratio"] = r["step_ms"] / q["step_ms"] if loaded else None
        r["mfu_ratio"] = r["mfu"] / q["mfu"] if loaded else None


def _run_child(spec: dict, tmp: Path) -> list[dict]:
    """Runs _measure(spec) in a fresh interpreter with the policy and threads of `spec` in its environment."""
    stem = f"{spec['policy']}-{spec['threads']}"
    spec_path, out_path = tmp / f"{stem}.spec.json", tmp / f"{stem}.rows.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "GRLIB_PROGRESS": "0", threads.THREADS_ENV: str(spec["threads"])}
    env.pop(threads.POLICY_ENV, None)
    if spec["policy"] == "default":
        env.pop("OMP_WAIT_POLICY", None)
        env[threads.POLICY_ENV] = "default"
    else:
        env["OMP_WAIT_POLICY"] = spec["policy"]
    cmd = [sys.executable, "-m", "grlib.bench.load", str(spec_path), str(out_path)]
    try:
        rc = subprocess.run(cmd, env=env, timeout=CHILD_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"bench load: the {stem} measurement ran over {CHILD_TIMEOUT_S} s") from None
    if rc != 0:
        raise RuntimeError(f"bench load: the {stem} measurement failed (exit {rc}; its error is above)")
    return json.loads(out_path.read_text())


def _measure(spec: dict) -> list[dict]:
    """In the child: the quiet, then the loaded condition, each peak / steps / peak."""
    from grlib import perf
    from grlib.data.catalog import load_dataset

    got = threads.policy()
    if (got["wait_policy"].split("+")[0], got["threads"]) != (spec["policy"], spec["threads"]):
        raise RuntimeError(f"bench load child runs with {got}, asked for {spec['policy']}, {spec['threads']} threads")
    cfg = load_config(spec["scale"], spec["overrides"])
    data = load_dataset(cfg, "scale").data
    rows = []
    for condition, n_hogs in (("quiet", 0), ("loaded", spec["hogs"])):
        with cpu_hogs(n_hogs, spec["hog_seconds"], spec["hog_kind"]) as hogs:
            load_1m = os.getloadavg()[0]
            start = time.perf_counter()
            with perf.measured_peak(tuple(spec["peak_sizes"])) as peak:
                timeline = _train_steps(cfg, data, spec["warmup"] + spec["steps"])[spec["warmup"]:]
            wall = time.perf_counter() - start
            hog_cpu_s = hogs.cpu_seconds()
        step_s = [_step_seconds(r) for r in timeline]
        flops = sum(r["flops"] for r in timeline)
        rows.append({
            **got, "condition": condition, "hogs": n_hogs, "hog_kind": spec["hog_kind"] if n_hogs else "",
            "hog_cpu_s": hog_cpu_s, "wall_s": wall,
            "loadavg_1m": load_1m, "steps": len(step_s), "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers,
            "batch": cfg.train.batch_size, "max_len": cfg.data.max_len,
            "tokens_per_step": sum(r["tokens"] for r in timeline) / len(timeline),
            "flops_per_step": flops / len(timeline),
            "step_ms": statistics.median(step_s) * 1e3, "step_ms_max": max(step_s) * 1e3,
            "peak_sizes": ",".join(map(str, spec["peak_sizes"])), "peak_gflops": peak.flops / 1e9,
            "peak_before_gflops": peak.before / 1e9, "peak_after_gflops": peak.after / 1e9,
            "mfu": perf.mfu(flops, sum(step_s), peak.flops),
            "peak_wall_gflops": peak.flops_wall / 1e9, "mfu_wall_peak": perf.mfu(flops, sum(step_s), peak.flops_wall),
        })
    return rows


def _train_steps(cfg, data, n: int) -> list[dict]:
    """The per-step timeline of `n` steps of the trainer (a fresh model seeded by train.seed, no validation)."""
    import torch

    from grlib import perf
    from grlib.model import build_model
    from grlib.train import train

    epochs = math.ceil(n / data.n_train_batches(cfg.train.batch_size))
    train_cfg = dataclasses.replace(cfg.train, max_steps=n, epochs=epochs)
    torch.manual_seed(train_cfg.seed)
    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    fit = train(model, data, train_cfg, cfg.data.max_len, cfg.negatives,
                flops_fn=lambda batch: perf.batch_flops(batch.offsets, cfg.model))
    if len(fit.timeline) != n:
        raise RuntimeError(f"bench load: the trainer ran {len(fit.timeline)} steps, {n} asked")
    return fit.timeline


def _step_seconds(record: dict) -> float:
    from grlib.train.step import PHASES

    return sum(record[f"{p}_s"] for p in PHASES)


if __name__ == "__main__":  # the child: python -m grlib.bench.load SPEC.json OUT.json
    spec_file, out_file = sys.argv[1:3]
    rows = _measure(json.loads(Path(spec_file).read_text()))
    Path(out_file).write_text(json.dumps(rows))
