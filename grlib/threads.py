"""OpenMP wait policy and intra-op thread count, set when grlib is imported (before torch loads).

Chosen: OMP_WAIT_POLICY=PASSIVE, and torch's intra-op threads bounded by the cores this process may
use (its affinity mask and its cgroup CPU quota); no bound by the cores "free" at start.

Why. libgomp (torch's CPU wheel and grlib._C share it) reads OMP_WAIT_POLICY once, when it loads.
By default an idle worker spins up to ~3 ms at every barrier before it sleeps; on cores that other
jobs also use, spinning workers take the CPU from the thread they wait for (and the scheduler
favours threads that sleep), so a region ends only when a descheduled thread gets a core back.
PASSIVE workers sleep at once: a busy machine slows a step by about its share of the cores.

Measured (`python -m grlib bench load --scale smoke`, HSTU 1x1 d=64, median of 20 steps, each
policy in a fresh process; 2-core VM, shared with other sessions' jobs, so every figure is noisy):
  quiet                     PASSIVE 14.0-16.7 ms, libgomp default 8.9-9.3 ms per smoke step;
                            laptop shape (`--scale laptop --steps 6`, 2x2 d=256): 251 vs 238 ms
  2 busy Python processes   PASSIVE 23.8 ms (1.70x its quiet step), default 17.6 ms (1.95x);
                            laptop shape 535 ms (2.13x) vs 573 ms (2.41x)
  2 torch jobs (default     PASSIVE 23.7 ms (1.42x), default 61.3 ms (6.6x)
  policy; `--hog-kind torch`)
  other sessions' test      PASSIVE 14-29 ms per step, default 111-1,666 ms (the issue saw 15.6 vs
  suites and compilers      1,066 ms); `bench negatives --scale smoke` 37 s vs 78 s (load 3-4)
  (load average 3-6)
PASSIVE costs a quiet smoke step ~5 ms (its many small parallel regions each wake a sleeping worker;
on this VM that is slow while the cores idle: with the Python hogs keeping them busy, a PASSIVE
step once ran faster loaded than quiet, 12.0 vs 16.7 ms) and a laptop-shaped one ~5%; in exchange
the worst case seen is ~2x instead of ~100x. A short spin before sleeping (GOMP_SPINCOUNT=1000) kept
the quiet smoke step at 8.9 ms but took 34.3 ms (3.9x) beside the torch jobs, where PASSIVE went
16.2 -> 21.3 ms in the same minutes (`GOMP_SPINCOUNT=1000 python -m grlib bench load --scale smoke
--policies passive --hog-kind torch`, then the same without GOMP_SPINCOUNT): not chosen. A machine
that runs nothing else can opt out (GRLIB_WAIT_POLICY=default).

Threads. torch already follows the affinity mask (taskset, cpusets: 1 thread when the mask allows 1
core) but not a cgroup CPU quota (docker --cpus, Kubernetes limits), where it starts one thread per
host core and the quota then throttles them all; the bound below covers both. Threads are not cut by
the load seen at start: with the 2 Python hogs, 1 thread gave 13.6 ms against 11.9 ms for 2
(`bench load --policies passive --threads 2 1`, load 3), the load average lags by a minute, and the
thread count changes the order of floating-point reductions, so the same command would give other
numbers on a busy machine.

Settings (the user's own environment wins):
  OMP_WAIT_POLICY     used as given (libgomp: ACTIVE or PASSIVE)
  GRLIB_WAIT_POLICY   when OMP_WAIT_POLICY is unset: passive (the default), active, or default
                      (libgomp's own spin-then-sleep: OMP_WAIT_POLICY left unset)
  GOMP_SPINCOUNT      passed on to libgomp, and named in the reported policy (PASSIVE+GOMP_SPINCOUNT=N)
  GRLIB_THREADS       torch's intra-op threads (a positive integer); else OMP_NUM_THREADS /
                      MKL_NUM_THREADS as torch reads them; else torch's count bounded by the cores
Child processes (papermill kernels, benchmark subprocesses) inherit OMP_WAIT_POLICY.

If libgomp was loaded before grlib (torch imported first), the policy cannot be changed any more:
`policy()` then reports the one libgomp read, and a RuntimeWarning says how to get PASSIVE.

    threads.policy()            -> {"wait_policy": "PASSIVE", "threads": 2}   (what result rows record)
    threads.inherited_policy()  -> "PASSIVE"   (what child processes get)
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import math
import os
import sys
import warnings
from pathlib import Path

POLICY_ENV = "GRLIB_WAIT_POLICY"
THREADS_ENV = "GRLIB_THREADS"
POLICIES = {"passive": "PASSIVE", "active": "ACTIVE", "default": "default"}  # GRLIB_WAIT_POLICY -> reported name
_OMP_LIBS = ("libgomp", "libomp", "libiomp")

# What configure_environment() found and did, once per process (None until grlib is imported).
_configured: dict[str, str] | None = None


def omp_loaded() -> bool:
    """Whether an OpenMP runtime is already mapped into this process (then it has read its settings)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # no procfs (macOS): torch is what loads one
        return "torch" in sys.modules
    return any(lib in maps for lib in _OMP_LIBS)


def _wait_policy_name(value: str | None) -> str:
    """The policy as reported: ACTIVE / PASSIVE / default, plus libgomp's spin count where it is set."""
    name = "default" if value is None else value.strip().upper()
    spin = os.environ.get("GOMP_SPINCOUNT")
    return name if spin is None else f"{name}+GOMP_SPINCOUNT={spin.strip()}"


def configure_environment() -> None:
    """Sets OMP_WAIT_POLICY (unless the user did) before an OpenMP runtime loads; grlib/__init__ calls it first."""
    global _configured
    if _configured is not None:
        return
    user = os.environ.get("OMP_WAIT_POLICY")
    wanted = os.environ.get(POLICY_ENV, "passive").strip().lower()
    if wanted not in POLICIES:
        raise ValueError(f"{POLICY_ENV}={os.environ[POLICY_ENV]!r}: expected one of {', '.join(POLICIES)}")
    preloaded = omp_loaded()
    if user is not None:
        effective, source = _wait_policy_name(user), "OMP_WAIT_POLICY"
    else:
        if wanted != "default":
            os.environ["OMP_WAIT_POLICY"] = POLICIES[wanted]  # child processes inherit it
        effective = _wait_policy_name(None if wanted == "default" else POLICIES[wanted])
        source = POLICY_ENV if POLICY_ENV in os.environ else "grlib"
        if preloaded and wanted != "default":
            effective, source = _wait_policy_name(None), "loaded before grlib"
            warnings.warn("grlib: an OpenMP runtime was loaded before grlib (torch imported first), so "
                          f"OMP_WAIT_POLICY={POLICIES[wanted]} cannot take effect in this process; import grlib "
                          "before torch or set OMP_WAIT_POLICY=PASSIVE in the environment", RuntimeWarning,
                          stacklevel=3)
    _configured = {"wait_policy": effective, "source": source}


def _threads_from_env() -> int | None:
    raw = os.environ.get(THREADS_ENV)
    if raw is None:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer (torch intra-op threads)")
    return n


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup"),
                     proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs allowed by this process's cgroup quota (the tightest over its cgroup and ancestors), None if unlimited."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        fields = line.split(":", 2)  # hierarchy-id:controllers:path
        if len(fields) != 3:
            continue
        controllers, rel = fields[1], fields[2]
        if controllers == "":  # cgroup v2: <root>/<path>/cpu.max = "<quota|max> <period>"
            base, files = root, ("cpu.max",)
        elif "cpu" in controllers.split(","):  # cgroup v1: <root>/cpu/<path>/cpu.cfs_{quota,period}_us
            base, files = root / "cpu", ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        folder = base / rel.strip("/")
        for d in (folder, *[p for p in folder.parents if p.is_relative_to(base)]):
            try:
                quota, period = (" ".join((d / f).read_text().strip() for f in files)).split()[:2]
                if quota not in ("max", "-1") and float(period) > 0:
                    limits.append(float(quota) / float(period))
            except (OSError, ValueError):  # absent here, or not the two numbers the kernel writes
                continue
    return min(limits) if limits else None


def cores_available() -> int:
    """Cores this process may run on: its affinity mask, cut by its cgroup CPU quota (rounded up)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def apply_thread_count() -> None:
    """Sets torch's intra-op threads: GRLIB_THREADS, else (when OMP_NUM_THREADS / MKL_NUM_THREADS are
    unset) torch's default bounded by cores_available(). Runs when torch has loaded (when_torch_loads)."""
    import torch

    n = _threads_from_env()
    if n is None and not ({"OMP_NUM_THREADS", "MKL_NUM_THREADS"} & set(os.environ)):
        n = min(torch.get_num_threads(), cores_available())
    if n is not None and n != torch.get_num_threads():
        torch.set_num_threads(n)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `import torch` first looks for torch, it takes torch's own spec
    and runs apply_thread_count() right after torch's module has executed, then leaves sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            exec_module = spec.loader.exec_module

            def exec_then_apply(module) -> None:
                exec_module(module)
                apply_thread_count()

            spec.loader.exec_module = exec_then_apply  # this spec's own loader instance
        return spec


def when_torch_loads() -> None:
    """apply_thread_count() now if torch is loaded, else as soon as something imports it: grlib's
    import does not load torch (a command's --help answers without it; tests/test_cli_startup.py).
    A bad GRLIB_THREADS is refused here, at grlib's import, not when torch loads later."""
    _threads_from_env()
    if "torch" in sys.modules:
        apply_thread_count()
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


def policy() -> dict[str, str | int]:
    """The OpenMP wait policy libgomp runs with and torch's intra-op threads now (columns of result rows)."""
    import torch

    if _configured is None:  # grlib.threads imported without grlib/__init__ (cannot happen through `import grlib`)
        raise RuntimeError("grlib.threads.configure_environment() has not run")
    return {"wait_policy": _configured["wait_policy"], "threads": torch.get_num_threads()}


def inherited_policy() -> str:
    """The wait policy a process started now from this environment runs with (its libgomp reads
    OMP_WAIT_POLICY as set here): grlib's choice, even where this process loaded libgomp too early."""
    return _wait_policy_name(os.environ.get("OMP_WAIT_POLICY"))


def describe() -> str:
    """One line for a benchmark's title: policy, where it came from, threads."""
    from grlib import memory

    p = policy()
    return (f"OpenMP wait policy {p['wait_policy']} ({_configured['source']}), {p['threads']} threads, "
            f"malloc {memory.policy()}")
