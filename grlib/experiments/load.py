"""Training step and GEMM peak under a concurrent CPU hog (`bench load`): quiet, then loaded, per
OpenMP wait policy.

For each wait policy (default: PASSIVE, grlib's choice, and libgomp's own default) one fresh
subprocess (libgomp reads the policy when it loads) trains the scale's HSTU with the trainer itself
(grlib.fit.train: data, forward, loss, backward, optimizer per step), twice:

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
"""
from __future__ import annotations

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

from grlib import threads
from grlib.config import Config, load_config

# torch and the trainer are imported in the functions that run them (the child's)

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
CHILD_TIMEOUT_S = 900
STEP_TARGET, MFU_TARGET = 3.0, 1.10  # loaded / quiet, for grlib's choice


@dataclasses.dataclass(frozen=True)
class Options:
    """Timed and untimed training steps per condition, the busy processes of the loaded condition
    (how many, python or torch, the upper bound on their life), the OpenMP wait policies (PASSIVE,
    ACTIVE, default: libgomp's own), each in a fresh process, the torch threads to measure each
    with (None: grlib's), and the square GEMM sizes of the peak (None: grlib.hardware.PEAK_SIZES)."""

    steps: int = 20
    warmup: int = 3
    hogs: int = 2
    hog_kind: str = "python"
    hog_seconds: float = 120.0
    policies: list[str] = dataclasses.field(default_factory=lambda: ["PASSIVE", "default"])
    threads: list[int] | None = None
    peak_sizes: list[int] | None = None


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


def measure(scale: str | None, overrides: dict, opt: Options) -> tuple[list[dict], Config, dict]:
    """Every (policy, threads, condition) row (table bench_load), the config they ran (the scale's with
    `overrides` and model.name hstu) and grlib's choice ({"wait_policy", "threads"})."""
    from grlib.data.catalog import load_dataset
    from grlib.hardware import PEAK_SIZES

    overrides = {**overrides, "model.name": "hstu"}  # the children rebuild cfg from these
    cfg = load_config(scale, overrides)
    load_dataset(cfg, "scale")  # prepared once here, not by every child at once
    mine = {"wait_policy": threads.inherited_policy(), "threads": threads.policy()["threads"]}
    spec = {"scale": cfg.scale, "overrides": overrides, "steps": opt.steps, "warmup": opt.warmup,
            "hogs": opt.hogs, "hog_kind": opt.hog_kind, "hog_seconds": opt.hog_seconds,
            "peak_sizes": opt.peak_sizes or list(PEAK_SIZES)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="grlib-bench-load-") as tmp:
        for policy in opt.policies:
            for n in dict.fromkeys(opt.threads or [mine["threads"]]):
                rows += _run_child({**spec, "policy": policy, "threads": n}, Path(tmp))
    for r in rows:
        r["grlib_choice"] = r["wait_policy"] == mine["wait_policy"] and r["threads"] == mine["threads"]
    _add_ratios(rows)
    return rows, cfg, mine


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
    cmd = [sys.executable, "-m", "grlib.experiments.load", str(spec_path), str(out_path)]
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
    from grlib.fit import train
    from grlib.model import build_model

    epochs = math.ceil(n / data.n_train_batches(cfg.train.batch_size))
    run_cfg = cfg.replace({"train.max_steps": n, "train.epochs": epochs})
    torch.manual_seed(run_cfg.train.seed)
    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    fit = train(model, data, run_cfg, flops_fn=lambda batch: perf.batch_flops(batch.offsets, cfg.model))
    if len(fit.timeline) != n:
        raise RuntimeError(f"bench load: the trainer ran {len(fit.timeline)} steps, {n} asked")
    return fit.timeline


def _step_seconds(record: dict) -> float:
    from grlib.train.step import PHASES

    return sum(record[f"{p}_s"] for p in PHASES)


if __name__ == "__main__":  # the child: python -m grlib.experiments.load SPEC.json OUT.json
    spec_file, out_file = sys.argv[1:3]
    rows = _measure(json.loads(Path(spec_file).read_text()))
    Path(out_file).write_text(json.dumps(rows))
