"""How freed memory goes back to the system: glibc malloc's policy, set when grlib is imported.

Chosen (GRLIB_MALLOC=keep, the default where the C library is glibc): no block gets a mapping of
its own (mallopt M_MMAP_MAX = 0) and the heap is not trimmed (M_TRIM_THRESHOLD at its maximum), so
the memory one step frees is what the next step's tensors get, already mapped.

Why. torch's CPU allocator calls malloc. glibc gives each block over its mmap threshold (128 KiB,
rising with use to at most 32 MiB) a fresh mmap and unmaps it when freed, so every large tensor a
step allocates is faulted in and zeroed by the kernel page by page, every step. A training step's
activations and gradients are such blocks: at the paper-like shape (8,192 tokens, d_model 1,536)
the uvqk projection's output and its gradient are [8192, 6144] bf16, 96 MiB each.

Measured (2-core Intel Xeon with AMX, family 6 model 0xa7, grlib._C path amx; issue 38's paper-like
`bench train` command, consecutive runs; docs/MEASUREMENTS.md):
  glibc's defaults                                   bf16 step 3,104 ms, fp32 8.21 s
  the same settings as glibc's environment           bf16 2,636 ms (peak RSS 2,580 -> 3,127 MB)
    variables (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_)
  GRLIB_MALLOC=keep (set in-process, this module)    bf16 2,846 ms, fp32 7.39 s
  torch's transparent huge pages for its             bf16 3,803 ms: slower (not chosen)
    allocations (THP_MEM_ALLOC_ENABLE=1)
The mechanism is checked, not timed, by tests/test_memory.py: a freed 64 MiB block's second use
faults its 16,384 pages in again under glibc's defaults and almost none under keep.
The cost: the resident set stays near its high-water mark instead of shrinking between steps
(memory is kept for reuse, as a GPU framework's caching allocator keeps it).

Settings (the user's own environment wins):
  GRLIB_MALLOC     keep (the default) or system (glibc's defaults, nothing set)
  MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_, or
  GLIBC_TUNABLES naming glibc.malloc     the user tunes malloc: grlib sets nothing
Where the C library is not glibc (macOS, musl) nothing is set and policy() says so.

    memory.policy()  -> "keep"    (benchmarks name it beside the thread policy: grlib.threads.describe)
"""
from __future__ import annotations

import ctypes
import os
import platform

ENV = "GRLIB_MALLOC"
CHOICES = ("keep", "system")
_USER_VARS = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc <malloc.h>
_INT_MAX = 2**31 - 1

_policy: str | None = None  # what configure() did, once per process


def _user_tuned() -> str | None:
    """The user's own malloc setting in the environment, if any (then grlib leaves malloc alone)."""
    for name in _USER_VARS:
        if name in os.environ:
            return name
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def configure() -> str:
    """Applies GRLIB_MALLOC once per process (grlib/__init__ calls it) and returns policy()."""
    global _policy
    if _policy is not None:
        return _policy
    wanted = os.environ.get(ENV, "keep").strip().lower()
    if wanted not in CHOICES:
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: expected one of {', '.join(CHOICES)}")
    user = _user_tuned()
    if wanted == "system":
        _policy = f"system ({ENV})"
    elif user is not None:
        _policy = f"system (tuned by {user})"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _policy = "system (not glibc)"
    else:
        libc = ctypes.CDLL(None)  # this process's own C library
        if libc.mallopt(_M_MMAP_MAX, 0) != 1 or libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX) != 1:
            raise RuntimeError(f"{ENV}=keep: glibc's mallopt refused M_MMAP_MAX=0 / M_TRIM_THRESHOLD; "
                               f"set {ENV}=system to run with glibc's defaults")
        _policy = "keep"
    return _policy


def policy() -> str:
    """keep, or system (and why): how this process's malloc returns freed memory."""
    if _policy is None:
        raise RuntimeError("grlib.memory.configure() has not run (import grlib first)")
    return _policy
