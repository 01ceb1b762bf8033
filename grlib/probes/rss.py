"""This process's resident set (Linux: /proc/self/status): the peak, a field, and a reset of the peak."""
from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident set size since it started its program (Linux: VmHWM of
    /proc/self/status). ru_maxrss would also count the parent's RSS at fork time (Linux keeps
    the larger of the two across exec), which is why the parent does not use it."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # other systems: an upper bound


def status_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")


def reset_peak_rss() -> bool:
    """Sets this process's peak resident set (VmHWM) to its resident set now (Linux: clear_refs 5);
    False where the kernel does not allow it (then the peak counts from the process's start)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True
