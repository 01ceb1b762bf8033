"""The device check's frame: its sizes (GPU, or the interpreter's tiny ones), parts bounded in time
(Run.part), timing (CUDA events or perf_counter), and the versions part with the machine's description."""
from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

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
            free_memory()
        seconds = time.monotonic() - start
        self.parts[name] = {"status": status, "seconds": round(seconds, 1), "note": note}
        print(f"== {name}: {status} in {seconds:.1f} s{': ' + note if note else ''}", flush=True)


def free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device) -> None:
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


def torch_device(run: Run):
    import torch

    return torch.device("cpu" if run.interpret else "cuda")
