"""The CUDA paths in one command on a bare GPU machine: versions, the Triton attention against the
padded reference, kernel timings, bf16 training steps of the paper preset; JSON result rows.

    python -m grlib.bench.device_check [OUT]       # make device-check; OUT: a folder (default $OUT)
    DEVICE_CHECK_INTERPRET=1 python -m grlib.bench.device_check OUT   # CPU, tiny shapes (about 20 s)

It needs only torch, triton, numpy and pyyaml besides the project tree (no polars, altair,
papermill, dvc, psutil or compiled grlib._C; no network, no install). Parts, each bounded in time
(a part out of time says so, keeps what it measured, and the next part runs; the whole check
stays under 8 minutes on an H100):

    versions     device, driver, CUDA, torch, triton (and fbgemm-gpu where importable)
    correctness  grlib.ops.triton_attention forward and every gradient (q, k, v, both bias tables)
                 against the padded reference on random ragged batches (empty and length-1
                 sequences in each), fp32 and bf16: the error of each, relative to the largest
                 value of the exact (float64 reference) tensor, is at most max(4 x the error of the
                 reference run in the same dtype, a floor per dtype); a mismatch fails the check
                 (exit status 1) after the rest has run. On CUDA, tl.dot multiplies fp32 inputs as
                 TF32, so the fp32 reference it is compared with runs its einsums with TF32 too
    gemm_peak    the bf16 GEMM peak of this device (square GEMMs, median of CUDA-event timings,
                 best size), before the kernels and again after the training steps: MFU divides
                 by the higher reading
    kernels      Triton vs the padded reference (and fbgemm-gpu's HSTU attention where importable)
                 at max_len 1024 and 4096, KuaiRand-27K-like lengths truncated and scaled
                 (grlib.data.synthetic.kuairand_lengths), fp32 and bf16, H x D of the paper preset (12 x 128):
                 forward and forward+backward medians of CUDA-event timings, peak memory
                 (torch.cuda.max_memory_allocated above the inputs); rows as bench_kernels'
    train        bf16 training steps of the paper preset (params.yaml scale paper-cpu: 16 x 12
                 layers, d 1536, max_len 4096, TurboGR's negative path) on batches of
                 KuaiRand-27K-like lengths cut at 4096, the largest batch of BATCHES that fits;
                 each step is grlib.train.step.TrainStep (forward, loss, backward, optimizer) as
                 `bench train` times it, here with CUDA events; MFU = grlib.perf's FLOPs per second
                 against the GPU's nominal bf16 peak (grlib.hardware.nominal.VENDOR_PEAKS, named in the
                 row) and against the bf16 GEMM peak measured in this run; the padded reference
                 attention (layers recomputed) is the baseline row of the same run; rows as
                 bench_train's

DEVICE_CHECK_INTERPRET=1 runs the same parts on CPU at tiny shapes under Triton's interpreter
(TRITON_INTERPRET=1; every other op on its PyTorch reference, no grlib._C); timings there are wall
clock and say nothing about a GPU. Without CUDA and without that variable it refuses in one line.

The output, OUT/device_check.json: {"device", "versions", "parts": {name: {"status", "seconds",
"note"}}, "checks": [...], "rows": [...]}, every row carrying its table (bench_kernels or
bench_train), scale and the result tables' metadata (run_id, git_rev, params_hash, hardware with
the device named, UTC timestamp) so that `python -m grlib import-rows OUT/device_check.json`
(grlib.cli.import_rows) appends them to results/tables/<table>/scale=<scale> beside the CPU rows.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

INTERPRET = "DEVICE_CHECK_INTERPRET"
OUTPUT = "device_check.json"
TRAIN_SCALE = "paper-cpu"  # the paper preset's model (params.yaml); its bench_train rows stand beside the CPU's
TOTAL_S = 440.0  # the whole check on a GPU (under 8 minutes with the interpreter's start and the imports)


@dataclass(frozen=True)
class Case:
    """One correctness case: B random lengths in [0, max_len] (one empty, one of length 1, one full)."""
    name: str
    max_len: int
    batch: int
    heads: int
    dqk: int
    dv: int
    bias: bool


@dataclass(frozen=True)
class Sizes:
    """What each part runs: the GPU's sizes, or the interpreter's tiny ones."""
    cases: tuple[Case, ...]
    max_lens: tuple[int, ...]
    regimes: tuple[str, ...]
    heads: int
    head_dim: int
    pair_budget: int  # sequences per timed batch: max(1, pair_budget // max_len**2), as bench kernels
    kernel_dtypes: tuple[str, ...]
    repeats: int
    warmup: int
    gemm_sizes: tuple[int, ...]
    train_overrides: dict = field(default_factory=dict)
    batches: tuple[int, ...] = (1,)  # training batch sizes tried in turn until one fits
    steps: int = 5
    train_warmup: int = 2
    n_items: int = 20000
    budgets: dict = field(default_factory=dict)  # seconds per part


GPU = Sizes(
    cases=(Case("ragged", 256, 9, 4, 64, 64, True), Case("odd dims", 130, 6, 3, 24, 40, True),
           Case("no bias", 512, 5, 2, 128, 128, False)),
    max_lens=(1024, 4096), regimes=("truncated", "scaled"), heads=12, head_dim=128, pair_budget=2**26,
    kernel_dtypes=("float32", "bfloat16"), repeats=5, warmup=2, gemm_sizes=(4096, 8192),
    batches=(16, 8, 4, 2, 1), steps=5, train_warmup=2,
    budgets={"correctness": 90, "gemm_peak": 15, "kernels": 120, "train": 170})  # Triton compiles in the first two
INTERPRETED = Sizes(
    cases=(Case("ragged", 40, 5, 2, 8, 8, True), Case("odd dims", 33, 4, 1, 5, 3, True)),
    max_lens=(32, 64), regimes=("truncated", "scaled"), heads=2, head_dim=16, pair_budget=8192,
    kernel_dtypes=("float32",), repeats=1, warmup=0, gemm_sizes=(128,),
    train_overrides={"model.n_layers": 2, "model.n_heads": 2, "model.d_model": 32, "data.max_len": 32,
                     "negatives.n_negatives": 16},
    batches=(2,), steps=1, train_warmup=1, n_items=200,
    budgets={"correctness": 60, "gemm_peak": 5, "kernels": 40, "train": 50})


class PartTimeout(BaseException):
    """A part's time is up (a BaseException: no `except Exception` inside a part swallows it)."""


@contextmanager
def bounded(seconds: float):
    """Raises PartTimeout inside the block after `seconds` (SIGALRM: checked between Python
    bytecodes, so a running kernel finishes first)."""
    def alarm(signum, frame):
        raise PartTimeout(f"out of time after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Run:
    """What the check has found so far (written as OUT/device_check.json)."""
    interpret: bool
    sizes: Sizes
    device: str = ""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    started: float = field(default_factory=time.monotonic)
    versions: dict = field(default_factory=dict)
    parts: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    gemm: list = field(default_factory=list)  # bf16 GEMM peak readings (FLOP/s)
    no_bf16: str = ""  # why bf16 is not checked here (the interpreter's bf16 tl.dot, interpreter_bf16_dot)

    def left(self) -> float:
        return TOTAL_S * (2 if self.interpret else 1) - (time.monotonic() - self.started)

    def part(self, name: str, fn: Callable[["Run"], str | None], budget: float | None = None) -> None:
        """Runs one part within its budget; records ok / failed / out of time and its note."""
        budget = min(self.sizes.budgets.get(name, 30) if budget is None else budget, self.left())
        print(f"\n== {name} (at most {budget:.0f} s)", flush=True)
        start = time.monotonic()
        status, note = "ok", ""
        try:
            if budget <= 0:
                raise PartTimeout("no time left for this part")
            with bounded(budget):
                note = fn(self) or ""
        except PartTimeout as err:
            status, note = "out of time", str(err)
        except Exception as err:  # the next part still runs; the check fails at the end
            import traceback

            traceback.print_exc()
            status, note = "failed", f"{type(err).__name__}: {err}"
        finally:
            _free_memory()
        seconds = time.monotonic() - start
        self.parts[name] = {"status": status, "seconds": round(seconds, 1), "note": note}
        print(f"== {name}: {status} in {seconds:.1f} s{': ' + note if note else ''}", flush=True)


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Milliseconds of a call: CUDA events on a GPU, perf_counter on CPU (the interpreter)."""

    def __init__(self, device):
        self.device = device

    def __call__(self, fn: Callable[[], object]) -> float:
        import torch

        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


# ---- versions ------------------------------------------------------------------------------------
def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _cpu_model() -> str:
    from grlib.hardware.isa import cpu_model

    return cpu_model()


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"


def versions(run: Run) -> str:
    import torch
    import triton

    v = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
         "cuda": torch.version.cuda or "none", "numpy": _version("numpy"), "fbgemm_gpu": _version("fbgemm-gpu"),
         "cpu": _cpu_model(), "interpret": run.interpret}
    if not run.interpret:
        props = torch.cuda.get_device_properties(0)
        v.update(device=torch.cuda.get_device_name(0), driver=_driver(), capability=f"{props.major}.{props.minor}",
                 memory_gb=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count)
    else:
        v.update(device=f"cpu (Triton interpreter): {v['cpu']}", driver="none")
    run.versions, run.device = v, v["device"]
    for k, val in v.items():
        print(f"  {k:16s} {val}")
    return f"{v['device']}; torch {v['torch']}, triton {v['triton']}, CUDA {v['cuda']}, driver {v['driver']}"


def _physical_cores() -> int:
    from grlib.hardware.nominal import cpu_info

    try:
        return len(set(cpu_info().cores.values()))
    except (OSError, RuntimeError):
        return 0


def hardware(run: Run) -> dict:
    """The result tables' `hardware` column (grlib.manifest.hardware's keys; psutil is not needed)."""
    import torch

    mem = math.nan
    try:
        with open("/proc/meminfo") as fh:
            mem = round(int(fh.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": run.versions.get("cpu", ""), "cores_logical": os.cpu_count() or 0,
            "cores_physical": _physical_cores(),
            "torch_threads": torch.get_num_threads(), "memory_gb": mem, "torch": torch.__version__,
            "fbgemm": run.versions.get("fbgemm_gpu", "absent"), "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()}", "device": run.device,
            "world": 1, "local_world": 1, "driver": run.versions.get("driver", ""),
            "triton": run.versions.get("triton", "")}


# ---- correctness ---------------------------------------------------------------------------------
# the error floor per compute dtype, relative to the exact tensor's largest value (the module doc)
FLOORS = {"float32": 1e-5, "tf32": 5e-3, "bfloat16": 2e-2}


def case_inputs(case: Case, device, seed: int) -> dict:
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, case.max_len + 1, case.batch)
    lengths[:3] = [0, 1, case.max_len]
    rng.shuffle(lengths)
    g = torch.Generator().manual_seed(seed)
    T, H = int(lengths.sum()), case.heads
    rand = lambda *s, scale=1.0: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(device)  # noqa: E731
    return dict(q=rand(T, H, case.dqk), k=rand(T, H, case.dqk), v=rand(T, H, case.dv),
                pos_bias=rand(H, 16, scale=0.5) if case.bias else None,
                time_bias=rand(H, 8, scale=0.5) if case.bias else None,
                timestamps=torch.randint(0, 400, (T,), generator=g).cumsum(0).to(device) if case.bias else None,
                offsets=torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).to(device),
                max_len=case.max_len, grad=rand(T, H, case.dv), lengths=lengths.tolist())


def attention_run(x: dict, impl: str, dtype, tf32: bool = False) -> list:
    """[out, dq, dk, dv, dpos, dtime] of one forward and backward (q, k, v in `dtype`, the bias tables
    in float32, or float64 for the exact run)."""
    import torch

    from grlib import ops

    table = torch.float64 if dtype == torch.float64 else torch.float32
    leaves = {n: x[n].detach().to(dtype).requires_grad_(True) for n in ("q", "k", "v")}
    leaves.update({n: x[n].detach().to(table).requires_grad_(True)
                   for n in ("pos_bias", "time_bias") if x[n] is not None})
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        out = ops.hstu_attention(leaves["q"], leaves["k"], leaves["v"], x["offsets"], x["max_len"], alpha=0.7,
                                 pos_bias=leaves.get("pos_bias"), time_bias=leaves.get("time_bias"),
                                 timestamps=x["timestamps"], impl=impl)
        out.backward(x["grad"].to(out.dtype))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return [out.detach()] + [leaves[n].grad for n in ("q", "k", "v", "pos_bias", "time_bias") if n in leaves]


def interpreter_bf16_dot() -> str:
    """'' when Triton's interpreter multiplies bf16 tiles right (tl.dot of two 16 x 16 bf16 tiles
    against torch in fp32), else what it got: Triton 3.9's interpreter gets them wrong (errors near
    1e10; the same tiles cast to fp32 first are right), so bf16 is checked on CUDA only."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def dot(x_ptr, y_ptr, o_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i[:, None] * N + i[None, :])
        y = tl.load(y_ptr + i[:, None] * N + i[None, :])
        tl.store(o_ptr + i[:, None] * N + i[None, :], tl.dot(x, y, out_dtype=tl.float32))

    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(16, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    out = torch.empty(16, 16)
    dot[(1,)](x, y, out, 16)
    err = float((out - x.float() @ y.float()).abs().max())
    return "" if err < 1e-2 else (f"Triton {triton.__version__}'s interpreter computes tl.dot of bf16 tiles "
                                  f"wrongly (16 x 16 probe: error {err:.1e}): bf16 is checked on CUDA only")


def correctness(run: Run) -> str:
    import torch

    device = _device(run)
    names = ["out", "dq", "dk", "dv", "dpos", "dtime"]
    failed = []
    run.no_bf16 = interpreter_bf16_dot() if run.interpret else ""
    if run.no_bf16:
        print(f"  {run.no_bf16}", flush=True)
    for i, case in enumerate(run.sizes.cases):
        x = case_inputs(case, device, seed=i)
        exact = attention_run(x, "reference", torch.float64)
        for dname in ("float32",) + (() if run.no_bf16 else ("bfloat16",)):
            dtype = getattr(torch, dname)
            tf32 = device.type == "cuda" and dtype == torch.float32  # tl.dot's fp32 inputs run as TF32 on CUDA
            low = attention_run(x, "reference", dtype, tf32=tf32)
            got = attention_run(x, "triton", dtype)
            floor = FLOORS["tf32" if tf32 else dname]
            for name, e, r, t in zip(names, exact, low, got):
                scale = max(float(e.abs().max()) if e.numel() else 0.0, 1e-30)
                err_ref = float((r.double() - e).abs().max()) / scale if e.numel() else 0.0
                err = float((t.double() - e).abs().max()) / scale if e.numel() else 0.0
                tol = max(4 * err_ref, floor)
                ok = math.isfinite(err) and err <= tol
                check = {"case": case.name, "lengths": x["lengths"], "heads": case.heads, "dqk": case.dqk,
                         "dv": case.dv, "dtype": dname + (" (TF32 dot)" if tf32 else ""), "tensor": name,
                         "err_triton": err, "err_reference": err_ref, "tolerance": tol, "ok": ok}
                run.checks.append(check)
                print(f"  {case.name:9s} {check['dtype']:20s} {name:5s} triton {err:.2e}  reference {err_ref:.2e}  "
                      f"tolerance {tol:.2e}  {'ok' if ok else 'MISMATCH'}", flush=True)
                if not ok:
                    failed.append(f"{case.name} {dname} {name}")
    if failed:
        raise AssertionError(f"Triton attention differs from the padded reference: {', '.join(failed)}")
    return (f"{len(run.checks)} tensors match (max error relative to the exact tensor's largest value)"
            + (f"; {run.no_bf16}" if run.no_bf16 else ""))


# ---- GEMM peak -----------------------------------------------------------------------------------
def gemm_peak(run: Run) -> str:
    """The best bf16 square GEMM rate (median of repeats, best size); appended to run.gemm."""
    import torch

    device, timer = _device(run), Timer(_device(run))
    best = {}
    for n in run.sizes.gemm_sizes:
        a, b = (torch.randn(n, n, device=device).to(torch.bfloat16) for _ in range(2))
        if device.type == "cpu":  # the interpreter's stand-in: a CPU without bf16 GEMMs computes in fp32
            a, b = a.float(), b.float()
        for _ in range(2):
            torch.mm(a, b)
        times = [timer(lambda: torch.mm(a, b)) for _ in range(5)]
        best[n] = 2 * n**3 / (statistics.median(times) / 1e3)
        print(f"  {n} x {n} x {n}: {best[n] / 1e12:.1f} TFLOP/s (median of 5)", flush=True)
    run.gemm.append(max(best.values()))
    where = " (fp32 on CPU)" if device.type == "cpu" else ""
    return f"bf16 GEMM peak {max(best.values()) / 1e12:.1f} TFLOP/s{where}"


# ---- kernels -------------------------------------------------------------------------------------
def fbgemm_hstu():
    """fbgemm-gpu's HSTU attention (fbgemm_gpu.experimental.hstu) where importable, else (None, why)."""
    try:
        from fbgemm_gpu.experimental.hstu import hstu_attn_varlen_func
    except Exception as err:  # ImportError, or a library that fails to load on this GPU
        return None, f"{type(err).__name__}: {err}"
    return hstu_attn_varlen_func, ""


def kernel_inputs(B: int, max_len: int, regime: str, H: int, D: int, dtype, device, seed: int = 0) -> dict:
    import torch

    from grlib.data.synthetic import kuairand_lengths

    lengths = torch.from_numpy(kuairand_lengths(B, max_len, regime, seed=seed))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    T = int(offsets[-1])
    g = torch.Generator().manual_seed(seed)

    def leaf(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(device, dtype).requires_grad_(True)

    gaps = torch.distributions.LogNormal(math.log(600.0), 2.0).sample((T,)).round().to(torch.int64)
    return dict(q=leaf(T, H, D), k=leaf(T, H, D), v=leaf(T, H, D), offsets=offsets.to(device), max_len=max_len,
                pos_bias=(torch.randn(H, 128, generator=g) * 0.1).to(device).requires_grad_(True),
                time_bias=(torch.randn(H, 32, generator=g) * 0.1).to(device).requires_grad_(True),
                timestamps=gaps.cumsum(0).to(device), lengths=lengths)


def kernel_forward(impl: str, x: dict, fbgemm_fn=None):
    import torch

    from grlib import ops

    if impl == "fbgemm_hstu":  # fbgemm-gpu's kernel, causal (window (-1, 0)), without the bias tables (rab None)
        off = x["offsets"].to(torch.int32)
        return fbgemm_fn(x["q"], x["k"], x["v"], off, off, x["max_len"], x["max_len"], num_contexts=None,
                         num_targets=None, window_size=(-1, 0), alpha=0.7)
    return ops.hstu_attention(x["q"], x["k"], x["v"], x["offsets"], x["max_len"], alpha=0.7,
                              pos_bias=x["pos_bias"], time_bias=x["time_bias"], timestamps=x["timestamps"], impl=impl)


def time_kernel(impl: str, x: dict, sizes: Sizes, device, fbgemm_fn=None) -> dict:
    import torch

    timer = Timer(device)
    leaves = [x[n] for n in ("q", "k", "v", "pos_bias", "time_bias")]
    grad = torch.ones(x["q"].shape[0], x["q"].shape[1], x["v"].shape[2], device=device, dtype=x["v"].dtype)

    def forward():
        with torch.no_grad():
            kernel_forward(impl, x, fbgemm_fn)

    def step():
        kernel_forward(impl, x, fbgemm_fn).backward(grad)
        for leaf in leaves:
            leaf.grad = None

    first = timer(step)  # compiles the kernels (Triton) on the first call
    for _ in range(sizes.warmup):
        step()
    peak = math.nan
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        _sync(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    fwd = [timer(forward) for _ in range(sizes.repeats)]
    fwd_bwd = [timer(step) for _ in range(sizes.repeats)]
    return {"fwd_ms": statistics.median(fwd), "fwd_bwd_ms": statistics.median(fwd_bwd), "first_fwd_bwd_ms": first,
            "peak_mem_mb": peak, "repeats": sizes.repeats}


def kernels(run: Run) -> str:
    import torch

    from grlib import hardware

    sizes, device = run.sizes, _device(run)
    fn, why = fbgemm_hstu() if device.type == "cuda" else (None, "the interpreter runs no fbgemm-gpu kernel")
    impls = ["reference", "triton"] + (["fbgemm_hstu"] if fn is not None else [])
    print(f"  fbgemm-gpu HSTU attention: {'timed' if fn is not None else 'not timed: ' + why}", flush=True)
    nominal = {d: _nominal(hardware, d, device) for d in sizes.kernel_dtypes}
    done = []
    try:
        for dname in sizes.kernel_dtypes:
            for max_len in sizes.max_lens:
                for regime in sizes.regimes:
                    B = max(1, sizes.pair_budget // max_len**2)
                    x = kernel_inputs(B, max_len, regime, sizes.heads, sizes.head_dim, getattr(torch, dname), device)
                    lengths = x["lengths"].double()
                    flops_fwd = float((2 * sizes.heads * 2 * sizes.head_dim * lengths**2 / 2).sum())
                    group = []
                    for impl in impls:
                        if impl == "fbgemm_hstu" and dname == "float32":  # its kernels take fp16 / bf16 only
                            continue
                        t, why = None, ""
                        try:
                            t = time_kernel(impl, x, sizes, device, fn)
                        except torch.OutOfMemoryError as err:  # the padded reference at a large batch
                            why = f"out of memory ({err})"
                        except Exception as err:  # fbgemm-gpu's API differs between its versions: its row only
                            if impl != "fbgemm_hstu":
                                raise
                            why = f"failed ({type(err).__name__}: {err})"
                        if t is None:  # freed here, not inside `except` (its traceback holds the tensors)
                            print(f"  {impl} {dname} {regime} {max_len}: no row, {why}".splitlines()[0], flush=True)
                            _free_memory()
                            continue
                        row = {"table": "bench_kernels", "op": "hstu_attention", "impl": impl,
                               "isa": "interpret" if run.interpret else "cuda", "regime": regime, "max_len": max_len,
                               "batch": B, "tokens": int(lengths.sum()), "fill": float(lengths.sum()) / (B * max_len),
                               "heads": sizes.heads, "head_dim": sizes.head_dim, "dtype": dname,
                               "threads": torch.get_num_threads(), "whole_batch": False, **t,
                               "gflops": 3.5 * flops_fwd / (t["fwd_bwd_ms"] * 1e6), "fwd_bwd_cpu_ms": math.nan,
                               "gflops_on_cpu": math.nan, "seed": 0, "isolated": False, "gemm_limit": "none",
                               "load_1m": os.getloadavg()[0], "cpu_model": run.versions.get("cpu", ""),
                               "device": run.device, "timing": "CUDA events" if device.type == "cuda" else "wall clock",
                               "with_bias": impl != "fbgemm_hstu",
                               "nominal_peak_gflops": nominal[dname][0] / 1e9, "nominal_peak_how": nominal[dname][1],
                               "frac_of_nominal": 3.5 * flops_fwd / (t["fwd_bwd_ms"] / 1e3) / nominal[dname][0]}
                        group.append(row)
                        print(f"  {dname:8s} {regime:9s} max_len {max_len:5d} B {B:3d} {impl:11s} "
                              f"fwd {t['fwd_ms']:9.3f} ms  "
                              f"fwd+bwd {t['fwd_bwd_ms']:9.3f} ms  peak {t['peak_mem_mb']:9.1f} MiB", flush=True)
                    ref = next((r for r in group if r["impl"] == "reference"), None)
                    for r in group:
                        r["speedup_vs_reference"] = ref["fwd_bwd_ms"] / r["fwd_bwd_ms"] if ref else math.nan
                        r["mem_reduction_vs_reference"] = (1 - r["peak_mem_mb"] / ref["peak_mem_mb"]
                                                           if ref and ref["peak_mem_mb"] > 0 else math.nan)
                        r["reference_estimate_mb"] = math.nan
                    done += group
                    del x
                    _free_memory()
    finally:
        run.rows += done  # what was measured before a timeout too
    return f"{len(done)} rows"


def _nominal(hardware, dname: str, device) -> tuple[float, str]:
    """(FLOP/s, how) of the device's nominal peak in dname; NaN with the reason where none is known."""
    if device.type == "cpu":
        return math.nan, "the interpreter: no nominal peak (not a GPU run)"
    try:
        peak = hardware.nominal_peak(dname, device=device)
    except ValueError as err:
        return math.nan, str(err)
    return peak.flops, peak.how


# ---- train ---------------------------------------------------------------------------------------
def train_batch(B: int, max_len: int, n_items: int, seed: int):
    """B sequences of KuaiRand-27K-like lengths cut at max_len: random items, actions, increasing
    timestamps; each token's target is the next item of its sequence (0 after the last)."""
    import numpy as np
    import torch

    from grlib.data.synthetic import kuairand_lengths
    from grlib.jagged import JaggedBatch
    from grlib.schema import FIRST_ITEM_ID, N_ACTION_CODES

    lengths = kuairand_lengths(B, max_len, "truncated", seed=seed)
    rng = np.random.default_rng(seed)
    T = int(lengths.sum())
    items = rng.integers(FIRST_ITEM_ID, n_items, T)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    targets = np.concatenate([items[1:], [0]])
    targets[offsets[1:] - 1] = 0  # no target after a sequence's last token
    ts = np.cumsum(np.round(rng.lognormal(math.log(600.0), 2.0, T)).astype(np.int64))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    return JaggedBatch(item_ids=t(items), actions=t(rng.integers(0, N_ACTION_CODES, T)), timestamps=t(ts),
                       offsets=t(offsets), max_len=max_len, targets=t(targets))


def train_config(run: Run, impl: str, batch: int, recompute: bool):
    """The paper preset in bf16 (fp32 under an interpreter whose bf16 tl.dot is wrong: Run.no_bf16)."""
    from grlib.config import load_config

    precision = "fp32" if run.no_bf16 else "bf16"
    return load_config(TRAIN_SCALE, {"model.name": "hstu", "model.precision": precision, "model.attention_impl": impl,
                                     "model.recompute_layers": recompute, "train.batch_size": batch,
                                     **run.sizes.train_overrides})


def time_training(run: Run, impl: str, batch: int, recompute: bool, steps: int, warmup: int) -> dict:
    """Median step time (CUDA events around TrainStep) and FLOPs of `steps` steps after `warmup`."""
    import contextlib

    import torch

    from grlib import perf
    from grlib.model import build_model
    from grlib.negatives import build_negative_path
    from grlib.ops import registry
    from grlib.train.optim import Optimizers
    from grlib.train.step import TrainStep

    cfg, device = train_config(run, impl, batch, recompute), _device(run)
    timer = Timer(device)
    # the interpreter: the attention stays on Triton (named), every other op on its PyTorch reference
    scope = registry.preferring("reference") if device.type == "cpu" else contextlib.nullcontext()
    with scope:
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, run.sizes.n_items, cfg.data.max_len, device=device)
        model.train()
        path = build_negative_path(cfg.negatives, run.sizes.n_items, seed=cfg.train.seed)
        step = TrainStep(model, path, Optimizers(model, cfg.train))
        times, flops, tokens, losses = [], [], [], []
        for i in range(warmup + steps):
            cpu_batch = train_batch(batch, cfg.data.max_len, run.sizes.n_items, seed=i)
            path.prepare(cpu_batch)  # the negatives, drawn ahead as async_sampling does (not timed)
            gpu_batch = cpu_batch.to(device)
            _sync(device)
            out = {}
            ms = timer(lambda: out.setdefault("r", step(iter([gpu_batch]))))
            losses.append(out["r"].loss)
            if i >= warmup:
                times.append(ms)
                flops.append(perf.batch_flops(cpu_batch.offsets, cfg.model))
                tokens.append(cpu_batch.num_tokens)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else math.nan
        from grlib.model import parameter_count

        count = parameter_count(model)
    if not all(math.isfinite(v) for v in losses):
        raise FloatingPointError(f"{impl}: a training loss is not finite: {losses}")
    return {"cfg": cfg, "times": times, "flops": flops, "tokens": tokens, "losses": losses, "peak_gb": peak,
            "params": count.total}


def train(run: Run) -> str:
    """The Triton model at the largest batch of sizes.batches that fits, then the padded reference
    (layers recomputed) at that batch, or the largest smaller one that fits."""
    import torch

    device = _device(run)
    sizes = run.sizes
    rows, fitted, notes = [], None, []
    try:
        for impl, recompute in (("triton", False), ("reference", True)):
            done = False
            for batch in (sizes.batches if fitted is None else [b for b in sizes.batches if b <= fitted]):
                t = None
                try:
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    t = time_training(run, impl, batch, recompute, sizes.steps, sizes.train_warmup)
                except torch.OutOfMemoryError:
                    pass
                if t is None:  # freed here, not inside `except` (its traceback holds the model)
                    print(f"  {impl}: batch {batch} does not fit", flush=True)
                    _free_memory()
                    continue
                fitted, done = fitted or batch, True
                rows.append(_train_row(run, impl, batch, recompute, t))
                r = rows[-1]
                print(f"  {impl:9s} batch {batch:2d}{' (layers recomputed)' if recompute else ''}: "
                      f"step {r['step_ms']:.1f} ms "
                      f"(median of {sizes.steps}), {r['tokens_per_step']} tokens, peak memory {t['peak_gb']:.1f} GiB, "
                      f"losses {', '.join(f'{v:.3f}' for v in t['losses'])}", flush=True)
                _free_memory()
                break
            if fitted is None:
                raise RuntimeError(f"no batch of {sizes.batches} fits with the {impl} attention")
            if not done:
                notes.append(f"the {impl} attention fits no batch up to {fitted}: no baseline row")
        notes += _same_loss(run, rows)
    finally:
        run.rows += rows
    return "; ".join([f"{len(rows)} rows, batch {fitted}"] + notes)


LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}  # relative, first step: the same model, data and dropout


def _same_loss(run: Run, rows: list[dict]) -> list[str]:
    """The first step's loss of the Triton model against the padded reference's at the same batch
    (same initialisation, data and dropout words): a check; AssertionError when they differ."""
    tri = next((r for r in rows if r["attention_impl"] == "triton"), None)
    ref = next((r for r in rows if r["attention_impl"] == "reference" and tri and r["batch"] == tri["batch"]), None)
    if ref is None:
        return ["no reference row at the Triton row's batch: first losses not compared"]
    a, b = tri["first_loss"], ref["first_loss"]
    tol = LOSS_TOLERANCE[tri["precision"]]
    ok = abs(a - b) <= tol * abs(b)
    run.checks.append({"case": "train", "dtype": tri["precision"], "tensor": "first loss", "triton": a, "reference": b,
                       "err_triton": abs(a - b) / abs(b), "tolerance": tol, "ok": ok})
    print(f"  first step's loss: triton {a:.5f}, reference {b:.5f} (relative difference {abs(a - b) / abs(b):.1e}, "
          f"tolerance {tol:g}) {'ok' if ok else 'MISMATCH'}", flush=True)
    if not ok:
        raise AssertionError(f"the Triton model's first loss {a} differs from the padded reference's {b}")
    return [f"first losses agree within {tol:g}"]


def _train_row(run: Run, impl: str, batch: int, recompute: bool, t: dict) -> dict:
    import torch

    from grlib import hardware, ops

    cfg, device = t["cfg"], _device(run)
    step_s = statistics.median(t["times"]) / 1e3
    flops = statistics.mean(t["flops"])
    nominal, how = _nominal(hardware, "bfloat16", device)
    return {"table": "bench_train", "params_hash": cfg.params_hash(), "attention_impl": impl, "compiled": False,
            "auto": ops.choose("hstu_attention", device) == impl, "precision": cfg.model.precision,
            "isa": "interpret" if run.interpret else "cuda", "cpu_model": run.versions.get("cpu", ""),
            "device": run.device, "gemm_limit": "none", "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers,
            "n_heads": cfg.model.n_heads, "batch": batch, "max_len": cfg.data.max_len, "params": t["params"],
            "tokens_per_step": int(statistics.mean(t["tokens"])),
            "real_fraction": statistics.mean(t["tokens"]) / (batch * cfg.data.max_len), "flops_per_step": flops,
            "step_ms": step_s * 1e3, "steps": len(t["times"]),
            "tokens_per_s": sum(t["tokens"]) / (sum(t["times"]) / 1e3), "peak_dtype": "bfloat16",
            "nominal_peak_dtype": "bfloat16", "nominal_peak_flops": nominal, "nominal_peak_how": how,
            "precision_note": run.no_bf16,
            "mfu_nominal": flops / step_s / nominal if nominal == nominal else math.nan,
            "recompute_layers": recompute, "peak_gpu_mem_gb": t["peak_gb"], "threads": torch.get_num_threads(),
            "timing": "CUDA events" if device.type == "cuda" else "wall clock", "first_loss": t["losses"][0],
            "final_loss": t["losses"][-1],
            "load_1m": os.getloadavg()[0], "step_s_all": [v / 1e3 for v in t["times"]]}


# ---- the run -------------------------------------------------------------------------------------
def _device(run: Run):
    import torch

    return torch.device("cpu" if run.interpret else "cuda")


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
    p = argparse.ArgumentParser(prog="python -m grlib.bench.device_check", description=__doc__.split("\n\n")[0])
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
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (grlib.ops.triton_attention)
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


if __name__ == "__main__":
    sys.exit(main())
