"""grlib.memory: glibc malloc keeps freed blocks for reuse (GRLIB_MALLOC=keep), or is left alone
(system, the user's own malloc variables, another C library). malloc reads its settings per process,
so each case runs in a fresh interpreter; what is checked is the effect, counted in page faults."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

SETTINGS = ("GRLIB_MALLOC", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

# Allocates and touches a 64 MiB block, frees it, then does it again: the minor page faults of the
# second round (a block unmapped when freed is faulted in again, 16,384 pages of 4 KiB).
FAULTS = """
import ctypes, json, resource, grlib
from grlib import memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 64 << 20
def round_trip():
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
print(json.dumps({"policy": memory.policy(),
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""

glibc_only = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="GRLIB_MALLOC=keep acts on glibc's malloc only; this C library is not glibc")


def _run(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    return subprocess.run([sys.executable, "-c", FAULTS], env={**base, **env}, capture_output=True, text=True,
                          timeout=120)


def _report(**env: str) -> dict:
    proc = _run(**env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@glibc_only
def test_keep_reuses_a_freed_block_without_faulting_it_in_again():
    kept, system = _report(), _report(GRLIB_MALLOC="system")
    assert kept["policy"] == "keep" and system["policy"] == "system (GRLIB_MALLOC)"
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert system["faults"] > pages // 2, system  # glibc's default: the block is mapped and faulted anew
    assert kept["faults"] < pages // 16, kept      # kept: the same pages serve the second block


@glibc_only
def test_the_users_own_malloc_settings_win():
    out = _report(MALLOC_TRIM_THRESHOLD_="1000000")
    assert out["policy"] == "system (tuned by MALLOC_TRIM_THRESHOLD_)"
    out = _report(GLIBC_TUNABLES="glibc.malloc.mmap_max=0")
    assert out["policy"] == "system (tuned by GLIBC_TUNABLES)"


def test_a_bad_setting_is_refused_naming_the_variable():
    proc = _run(GRLIB_MALLOC="sometimes")
    assert proc.returncode != 0
    assert "GRLIB_MALLOC='sometimes': expected one of keep, system" in proc.stderr
