"""The hardware and software a result was measured on (stored with every result row)."""
from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from typing import TYPE_CHECKING

import psutil

from grlib import paths

if TYPE_CHECKING:
    import torch


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def device_name(device: str | torch.device = "cpu") -> str:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu:{_cpu_model()}"


@functools.cache
def hardware(device: str = "cpu") -> dict[str, str | int]:
    """cpu, cores, threads, torch / fbgemm versions, device, and the process layout (world: ranks in
    all, local_world: ranks per node; 1 and 1 for one process) from torchrun's environment."""
    import torch  # here, not at module level: result writers import this module, --help imports them

    fbgemm = _version("fbgemm-gpu-cpu")
    if fbgemm == "absent":
        fbgemm = _version("fbgemm-gpu")
    return {
        "cpu": _cpu_model(),
        "cores_logical": os.cpu_count() or 0,
        "cores_physical": psutil.cpu_count(logical=False) or 0,
        "torch_threads": torch.get_num_threads(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "torch": torch.__version__,
        "fbgemm": fbgemm,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "device": device_name(device),
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))),
    }


@functools.cache
def git_revision() -> str:
    """HEAD's short hash, with '+dirty' when tracked files differ from it; 'unknown' outside git."""
    try:
        root = paths.project_root()
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                             capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "grlib", "kernels"],
                               cwd=root, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError, FileNotFoundError):
        return "unknown"
