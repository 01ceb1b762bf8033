"""Which GEMM library `grlib.ops.linear(..., impl="auto")` takes for float32 on CPU: measured on the
machine at hand, once, and kept for it.

    GRLIB_GEMM=onednn|blas   forces one (anything else: a ConfigError naming the variable)
    else                     the choice recorded for this machine, or, the first time, a linear
                             layer's forward + backward ([2048, 512] x [512, 2048]^T, the shape of
                             HSTU's uvqk projection at d 512) timed through both libraries: BLAS
                             (torch.mm: MKL in torch's x86 wheels) and oneDNN (grlib.ops.matmul);
                             the faster median on-CPU time wins

Why measure: the faster library depends on the CPU and on its limits. MKL's sgemm takes its AVX2
code on AMD CPUs (100 against oneDNN's 215-236 GFLOP/s per Zen 5 core here), while on an Intel Xeon
MKL ran a layer 1.05-2.4x faster than oneDNN, whose products with a strided operand were slow; on
an AVX2-only CPU (or under GRLIB_ISA=avx2, grlib.gemm_limits) either may lead.

Why keep it: a choice re-measured in every process could differ between the ranks of one run, or
between a run and its resumption, and the two libraries round differently. The choice is stored
per machine key (CPU model, family and model, vector flags, the GEMM limits in force, torch's
version, torch's threads) in a file of its own under grlib's cache folder (GRLIB_CACHE_DIR, else the
user cache, e.g. ~/.cache/grlib: where downloads are kept too), created whole (a temporary file, then a hard link
that fails if the file exists): the first process to record a key wins, and one that measured
at the same time takes the recorded choice. Every later process on the machine reads it. The
launcher of grlib.distributed chooses before it starts the ranks. Delete the file to measure again;
`describe()` says what was chosen, when and from which times (bench rows record it).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

from grlib import io

GEMM_ENV = "GRLIB_GEMM"
CACHE_ENV = "GRLIB_CACHE_DIR"
CHOICES = {"onednn": "onednn", "blas": "reference"}  # GRLIB_GEMM (and the record) -> the linear implementation
SHAPE = (2048, 512, 2048)  # tokens, in, out of the layer timed
REPEATS = 5


def cache_dir() -> Path:
    """grlib's cache folder, the downloads' too (grlib.data.download): GRLIB_CACHE_DIR, else the user
    cache (pooch.os_cache("grlib"), e.g. ~/.cache/grlib)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    import pooch

    return Path(pooch.os_cache("grlib"))


def machine_key() -> dict:
    """What the choice depends on (module doc)."""
    import torch

    from grlib import gemm_limits
    from grlib.hardware.isa import cpu_fields, cpu_flags

    cpu = cpu_fields()
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma", "sse4", "asimd", "sve")))
    return {"cpu": cpu.get("model name", "unknown"), "family": cpu.get("cpu family", ""),
            "model": cpu.get("model", ""), "flags": " ".join(flags), "gemm_limit": gemm_limits.describe(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def _record_path(key: dict) -> Path:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"gemm-choice-{digest}.json"


def time_libraries(shape: tuple[int, int, int] = SHAPE, repeats: int = REPEATS) -> dict[str, float]:
    """Median on-CPU ms (min(wall, process CPU time / threads)) of a linear layer's forward + backward
    through each library, the two alternating repeat by repeat (2 warm-ups each); with autograd on,
    whatever the caller's mode (the first float32 linear may run under torch.no_grad())."""
    import torch

    from grlib.ops import registry

    n, d_in, d_out = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d_in, generator=g).requires_grad_(True)
    w = torch.randn(d_out, d_in, generator=g).requires_grad_(True)
    b = torch.randn(d_out, generator=g).requires_grad_(True)
    fns = {lib: registry.resolve("linear", "cpu", CHOICES[lib]) for lib in ("blas", "onednn")}  # grlib.ops.matmul
    threads, times = torch.get_num_threads(), {name: [] for name in fns}
    with torch.enable_grad():
        for i in range(repeats + 2):
            for name, fn in fns.items():
                wall, cpu = time.perf_counter(), time.process_time()
                fn(x, w, b).sum().backward()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                x.grad = w.grad = b.grad = None
                if i >= 2:
                    times[name].append(1e3 * min(wall, cpu / threads))
    return {name: statistics.median(t) for name, t in times.items()}


def _write_once(path: Path, record: dict) -> dict:
    """Writes `record` to `path` unless it exists; returns the record the file holds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = io.temp_file(path.parent, path.name)
    tmp.write_text(json.dumps(record, indent=1))
    try:
        os.link(tmp, path)  # fails if another process recorded first: its choice stands
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return json.loads(path.read_text())


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("library") in CHOICES else None


@functools.cache
def record() -> dict:
    """The choice for this process: {"library": "onednn" | "blas", "how": ..., ...} (module doc)."""
    import torch

    from grlib.config import ConfigError

    forced = os.environ.get(GEMM_ENV, "").strip().lower()
    if forced:
        if forced not in CHOICES:
            raise ConfigError(f"{GEMM_ENV}={os.environ[GEMM_ENV]!r}: must be one of {', '.join(CHOICES)}")
        return {"library": forced, "how": f"forced by {GEMM_ENV}={forced}"}
    if not torch.backends.mkldnn.is_available():
        return {"library": "blas", "how": "this torch build has no oneDNN"}
    key = machine_key()
    path = _record_path(key)
    found = _read(path)
    if found is None:
        ms = time_libraries()
        measured = {"library": min(ms, key=ms.get), "ms": ms, "shape": list(SHAPE), "key": key,
                    "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            found = _write_once(path, measured)
        except OSError as e:  # an unwritable cache: this process's own measurement, said so
            return {**measured, "how": f"measured in this process (not kept: {path}: {e.strerror})"}
    ms = found.get("ms", {})
    times = ", ".join(f"{lib} {t:.1f} ms" for lib, t in ms.items())
    return {**found, "how": f"measured {found.get('measured_at', '?')} on this machine ({times} for a "
                            f"{'x'.join(map(str, found.get('shape', SHAPE)))} linear layer's forward + backward; "
                            f"kept in {path})"}


def cpu_linear_impl() -> str:
    """The linear implementation `auto` takes for float32 on CPU: 'onednn' or 'reference' (BLAS)."""
    return CHOICES[record()["library"]]


def describe() -> str:
    """'onednn: measured ... (times; file)' for result rows and headers."""
    r = record()
    return f"{r['library']}: {r['how']}"
