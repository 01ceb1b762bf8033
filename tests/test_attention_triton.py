"""The Triton HSTU attention kernels, run by Triton's interpreter on CPU tensors (small shapes),
against the padded reference, forward and all gradients: 3 fixed cases and the CPU kernel's random
ragged batches (hypothesis, float32 and bfloat16, its tolerances); the refusal of CPU tensors
without the interpreter; and the NPU dispatch's clear error.

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

# The child: 3 fixed cases (an empty sequence, length 1, two 32-tiles, D < 16, one sequence == max_len,
# float64), then the CPU kernel's random ragged batches (tests/test_attention.py: its `batches`
# strategy and tolerances, forward and every gradient against the float64 reference), EXAMPLES of
# float32 and EXAMPLES of bfloat16: the interpreter runs each program in Python (about 40 s in all
# on 2 shared cores; the CPU kernel's test draws 60 of both)
EXAMPLES = 20
CHILD = textwrap.dedent('''
    import sys

    import torch
    from hypothesis import HealthCheck, given, settings

    from grlib import ops

    sys.path.insert(0, sys.argv[1])  # tests/: the CPU kernel's cases
    from test_attention import _compare, batches

    import numpy as np
    import triton
    import triton.language as tl
    from triton.runtime import interpreter


    @triton.jit
    def _dot(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
        i, j = tl.arange(0, N)[:, None], tl.arange(0, N)[None, :]
        tl.store(c_ptr + i * N + j, tl.dot(tl.load(a_ptr + i * N + j), tl.load(b_ptr + i * N + j)).to(tl.float32))


    def bf16_dot_error():
        a, b = torch.randn(16, 16).bfloat16(), torch.randn(16, 16).bfloat16()
        c = torch.empty(16, 16)
        _dot[(1,)](a, b, c, 16)
        return float((c - a.float() @ b.float()).abs().max())


    # The interpreter's tl.dot multiplies bfloat16 operands' raw bits as integers (Triton 3.9.0:
    # interpreter.create_dot widens fp8 only; bfloat16 is kept as uint16): where it still does, the
    # child widens them to float32 first, as a GPU's tensor cores do (bf16 products, fp32 sums), so
    # that the kernels' own bf16 loads, casts and stores are what the cases check
    error = bf16_dot_error()
    if error > 1e-3:
        plain = interpreter.InterpreterBuilder.create_dot

        def widened(h):
            if getattr(h.dtype, "scalar", h.dtype) != tl.bfloat16:
                return h
            return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            return plain(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

        interpreter.InterpreterBuilder.create_dot = create_dot
        assert bf16_dot_error() < 1e-3, "the widened bfloat16 tl.dot is still wrong"
        print(f"interpreter bf16 tl.dot widened (its own was off by {error:.3g})")
    else:
        print("interpreter bf16 tl.dot as it is")

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
    fixed = 0
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
        fixed += 1

    drawn = {torch.float32: 0, torch.bfloat16: 0}
    for dtype in drawn:
        @settings(max_examples=int(sys.argv[2]), deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(case=batches(dtypes=(dtype,)))
        def matches_reference(case):
            _compare(case, "triton")
            drawn[case["q"].dtype] += 1

        matches_reference()
    print("fixed", fixed, "float32", drawn[torch.float32], "bfloat16", drawn[torch.bfloat16])
''')


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed; `make test` (or `pip install -e .[interpret]`) "
                    "installs it to run these kernels under TRITON_INTERPRET=1")
@pytest.mark.slow
def test_triton_kernels_match_reference_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    tests = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", CHILD, tests, str(EXAMPLES)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert f"fixed 3 float32 {EXAMPLES} bfloat16 {EXAMPLES}" in proc.stdout, proc.stdout
    print(proc.stdout)  # -s shows whether the interpreter's bf16 tl.dot needed widening


def test_triton_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # read at each call: refused whatever this process set
    if not HAS_TRITON:
        with pytest.raises(ImportError, match="needs triton"):
            ops.hstu_attention(torch.randn(2, 1, 4), torch.randn(2, 1, 4), torch.randn(2, 1, 4),
                               torch.tensor([0, 2]), 2, impl="triton")
    else:
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
