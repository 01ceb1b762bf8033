"""The Triton HSTU attention kernels, run by Triton's interpreter on CPU tensors (tiny shapes),
against the padded reference, forward and all gradients; and the NPU dispatch's clear error.

The interpreter must be switched on before triton is imported, so the Triton cases run in a
child process with TRITON_INTERPRET=1. They need the `triton` package, which `make test` installs
(extra `interpret`); in an environment without it they skip and say so.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from grlib import ops

HAS_TRITON = importlib.util.find_spec("triton") is not None

CHILD = textwrap.dedent('''
    import torch
    from grlib import ops

    def run(case, impl, dtype=None):
        cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
        names = ["q", "k", "v", "pos_bias", "time_bias"]
        leaves = {n: cast(case[n]).detach().requires_grad_(True) if case[n] is not None else None for n in names}
        out = ops.hstu_attention(leaves["q"], leaves["k"], leaves["v"], case["offsets"], case["max_len"],
                                 alpha=0.6, pos_bias=leaves["pos_bias"], time_bias=leaves["time_bias"],
                                 timestamps=case["timestamps"], impl=impl)
        out.backward(torch.linspace(-1, 1, out.numel()).view(out.shape).to(out.dtype))
        return [out.detach()] + [leaves[n].grad for n in names if leaves[n] is not None]

    g = torch.Generator().manual_seed(0)
    checked = 0
    for lengths, H, D, Dv, with_bias, dtype in [
        ([3, 0, 1, 40], 2, 5, 3, True, torch.float32),   # empty, length 1, two 32-tiles, D < 16
        ([33], 1, 16, 16, False, torch.float32),          # one sequence == max_len
        ([7, 2], 3, 9, 9, True, torch.float64),
    ]:
        T = sum(lengths)
        case = dict(q=torch.randn(T, H, D, generator=g, dtype=dtype), k=torch.randn(T, H, D, generator=g, dtype=dtype),
                    v=torch.randn(T, H, Dv, generator=g, dtype=dtype),
                    offsets=ops.offsets_from_lengths(torch.tensor(lengths)), max_len=max(lengths),
                    pos_bias=torch.randn(H, 6, generator=g, dtype=dtype) if with_bias else None,
                    time_bias=torch.randn(H, 5, generator=g, dtype=dtype) if with_bias else None,
                    timestamps=torch.randint(0, 50, (T,), generator=g) if with_bias else None)
        exact = run(case, "reference", torch.float64)
        got = run(case, "triton")
        for a, b in zip(got, exact):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)
        checked += 1
    print("checked", checked)
''')


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed; `make test` (or `pip install -e .[interpret]`) "
                    "installs it to run these kernels under TRITON_INTERPRET=1")
@pytest.mark.slow
def test_triton_kernels_match_reference_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "checked 3" in proc.stdout


def test_triton_refuses_cpu_tensors_without_the_interpreter():
    if not HAS_TRITON:
        with pytest.raises(ImportError, match="needs triton"):
            ops.hstu_attention(torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4),
                               torch.tensor([0, 2]), 2, impl="triton")
    elif os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(RuntimeError, match="runs on CUDA tensors"):
            ops.hstu_attention(torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4),
                               torch.tensor([0, 2]), 2, impl="triton")


def test_npu_dispatch_names_what_is_missing():
    missing = [m for m in ("torch_npu", "fbgemm_ascend") if importlib.util.find_spec(m) is None]
    if not missing:
        pytest.skip("torch-npu and fbgemm-ascend are installed: this is an NPU machine")
    with pytest.raises(ImportError, match="'npu' implementation needs") as err:
        ops.hstu_attention(torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4),
                           torch.tensor([0, 2]), 2, impl="npu")
    for module in missing:
        assert module in str(err.value)
