"""One dispatcher for every jagged op: picks an implementation by device, or by explicit override.

Implementations register a *loader* (a function returning the op; `lazy(module, name)` for one in
a backend's module) so that nothing heavy is imported, and no device probed, until an op is first
used; each op's module (grlib.ops.attention, ...) registers its implementations when imported.
`auto` takes the first implementation registered for the op in the device's preference order; a
registered implementation that fails to load raises its own error (no silent fallback to a slower
path).

`preferring(impl)` puts one implementation first for `auto` within a block (every op that has it
registered), e.g. preferring("reference") runs a model as plain PyTorch (bench train's
torch.compile row); explicit implementation names are unaffected.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Callable, Iterator

import torch

IMPLS = ("reference", "fbgemm", "cpu", "triton", "npu", "loop", "loop_compile", "onednn")
PREFERENCE = {
    "cpu": ("cpu", "onednn", "reference"),
    "cuda": ("triton", "fbgemm", "reference"),
    "npu": ("npu", "reference"),
}

# The device types each implementation runs on ("triton" on CPU only under TRITON_INTERPRET=1, for tests).
RUNS_ON = {"reference": ("cpu", "cuda", "npu"), "fbgemm": ("cpu", "cuda"), "cpu": ("cpu",), "triton": ("cuda",),
           "npu": ("npu",), "loop": ("cpu", "cuda", "npu"), "loop_compile": ("cpu", "cuda"), "onednn": ("cpu",)}

_PREFERRED: contextvars.ContextVar[str | None] = contextvars.ContextVar("grlib_preferred_impl", default=None)
_LOADERS: dict[str, dict[str, Callable[[], Callable]]] = {}
_LOADED: dict[tuple[str, str], Callable] = {}


def register(op: str, impl: str, loader: Callable[[], Callable]) -> None:
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}; valid: {', '.join(IMPLS)}")
    _LOADERS.setdefault(op, {})[impl] = loader


def lazy(module: str, name: str) -> Callable[[], Callable]:
    """The loader of grlib.ops.<module>.<name> (e.g. lazy("cpu.attention", "hstu_attention")): the
    module is imported when the op first resolves to it."""
    return lambda: getattr(importlib.import_module(f"grlib.ops.{module}"), name)


def implementations(op: str) -> tuple[str, ...]:
    if op not in _LOADERS:
        raise KeyError(f"unknown op {op!r}; registered ops: {', '.join(sorted(_LOADERS))}")
    return tuple(i for i in IMPLS if i in _LOADERS[op])


def runnable(op: str, device: torch.device | str) -> tuple[str, ...]:
    """The registered implementations of `op` that run on tensors of `device` (benchmarks loop over these)."""
    dev = torch.device(device).type
    return tuple(i for i in implementations(op) if dev in RUNS_ON[i])


def choose(op: str, device: torch.device | str, impl: str = "auto") -> str:
    """The implementation `auto` resolves to for `op` on `device` (or `impl` itself, checked)."""
    available = implementations(op)
    if impl != "auto":
        if impl not in available:
            raise ValueError(f"{op}: implementation {impl!r} is not available; "
                             f"registered: {', '.join(available)} (or 'auto')")
        return impl
    dev = torch.device(device).type
    preferred = _PREFERRED.get()
    if preferred in available and dev in RUNS_ON[preferred]:
        return preferred
    for candidate in PREFERENCE.get(dev, ("reference",)):
        if candidate in available:
            return candidate
    raise ValueError(f"{op}: no implementation for device {dev!r}; registered: {', '.join(available)}")


@contextlib.contextmanager
def preferring(impl: str) -> Iterator[None]:
    """Within: `auto` resolves to `impl` for every op that registers it (and runs on the device)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}; valid: {', '.join(IMPLS)}")
    token = _PREFERRED.set(impl)
    try:
        yield
    finally:
        _PREFERRED.reset(token)


def resolve(op: str, device: torch.device | str, impl: str = "auto") -> Callable:
    name = choose(op, device, impl)
    key = (op, name)
    if key not in _LOADED:
        _LOADED[key] = _LOADERS[op][name]()
    return _LOADED[key]
