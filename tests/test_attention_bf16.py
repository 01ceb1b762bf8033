"""The bf16 attention on the CPU's bf16 units (grlib._C's amx and avx512_bf16 paths,
kernels/cpu/hstu_attention_bf16.cpp) against the float64 padded reference, forward and every
gradient, on ragged hypothesis batches (empty and length-1 sequences likely), both backward forms,
the plain op and HSTU's fused uvqk op; and the forced paths: each unit gives bitwise the same result
whichever wider path the CPU has.

Tolerance, derived from where the kernel rounds (the inputs are bf16 already, so exact in float32):
every tile product multiplies bf16 factors with float32 sums, and the factors that are not inputs
are rounded once to bf16 (round to nearest even, relative error at most u = 2^-9): the weights W
and dL/dscores dS of each tile (and SiLU(x) in the fused op). An output o = sum_j W_j v_j is then
off by at most u * sum_j |W_j v_j| <= u * n * max|W_j v_j| in the worst case; with independent
rounding errors the sum grows like sqrt(n), and the float32 output is rounded once more to bf16 (u).
We allow 8u = 2^-6 ~= 1.6% of (1 + max |exact|) absolute and 2^-6 relative: the float32-converting
kernels' bound (2e-2, tests/test_attention.py) tightened to what bf16 products need. Bias-table
gradients sum up to L^2 / 2 rounded dS terms: 2^-5 of (1 + max |exact|).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from grlib.hardware import isa
from tests.test_attention import _run, _strided, batches

U = 2.0 ** -9  # bf16 unit roundoff (round to nearest even)
UNITS = [p for p in isa.BF16_PATHS]


def _units_or_skip(path: str) -> None:
    if path not in isa.available():
        pytest.skip(f"the {path} path needs the CPU flags {' '.join(isa.NEEDS[path])} and an AVX-512 build; "
                    f"this machine has {', '.join(isa.available())}")


@pytest.fixture(autouse=True)
def dpbf16_tiles():
    """The avx512_bf16 path's vdpbf16ps tiles on for these tests (off by default: GRLIB_DPBF16_ATTENTION)."""
    import grlib.ops.cpu  # noqa: F401
    import grlib._C as C

    before = C.dpbf16_attention()
    C.set_dpbf16_attention(True)
    yield
    C.set_dpbf16_attention(before)


def _tol(exact: torch.Tensor, table: bool = False) -> dict:
    scale = 1.0 + (float(exact.abs().max()) if exact.numel() else 0.0)
    k = 16 if table else 8
    return dict(rtol=k * U, atol=k * U * scale)


def _compare(case: dict, path: str) -> None:
    exact = _run(case, "reference", torch.float64)
    with isa.use(path):
        got = _run(case, "cpu")
    for name, a, b in zip(["out", "dq", "dk", "dv", "dpos_bias", "dtime_bias"], got, exact):
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert a.dtype == torch.bfloat16, (name, a.dtype)
        torch.testing.assert_close(a.double(), b, **_tol(b, table=name.endswith("bias")),
                                   msg=lambda m: f"{path} {name}: {m}")


@pytest.mark.parametrize("path", UNITS)
@settings(max_examples=40)
@given(case=batches(max_length=150, max_dim=40, dtypes=(torch.bfloat16,)))
def test_bf16_units_match_reference(path, case):
    """Several 64-token tiles (partial last tiles), head dims that are not multiples of 32."""
    _units_or_skip(path)
    _compare(case, path)


@pytest.mark.parametrize("path", UNITS)
@settings(max_examples=40)
@given(case=batches(max_length=150, max_dim=24, dtypes=(torch.bfloat16,), max_buckets=48))
def test_bf16_time_terms_of_every_kind(path, case):
    """The time term's three forms in the vector pass (hstu_attention_bf16.cpp, Row): one bucket over a
    row (a constant), a bucket per lane from a two-vector table (up to 32 buckets, the upper vector
    from bucket 16: spans up to 2^40), and time_row's runs (over 32 buckets, and where the gradients
    need runs); sorted and unsorted timestamps."""
    _units_or_skip(path)
    _compare(case, path)


@pytest.mark.parametrize("path", UNITS)
@pytest.mark.parametrize("buckets", [17, 32, 33, 48])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_bf16_time_buckets_across_the_table(path, buckets, order):
    """Timestamps growing geometrically (ts = 2^(40 x / L)), so a row meets every bucket from 0 (its own
    key) to the last: the lane-by-lane lookup's both table vectors (buckets 16-31), the runs past 32
    buckets, and (shuffled) unsorted timestamps; both backward forms."""
    _units_or_skip(path)
    import grlib.ops.cpu.attention  # noqa: F401

    g = torch.Generator().manual_seed(buckets)
    lengths = [150, 0, 1, 97]
    ts = torch.cat([torch.floor(2.0 ** (40 * torch.arange(n, dtype=torch.float64) / max(n, 1))).long()
                    for n in lengths])
    if order == "shuffled":
        ts = ts[torch.randperm(len(ts), generator=g)]
    T, H, D = sum(lengths), 2, 24
    case = dict(q=torch.randn(T, H, D, generator=g).bfloat16(), k=torch.randn(T, H, D, generator=g).bfloat16(),
                v=torch.randn(T, H, D, generator=g).bfloat16(),
                offsets=ops.offsets_from_lengths(torch.tensor(lengths)), max_len=150, alpha=None,
                pos_bias=torch.randn(H, 9, generator=g).bfloat16(),
                time_bias=torch.randn(H, buckets, generator=g).bfloat16(), timestamps=ts)
    _compare(case, path)  # the forward and the autograd backward (one pass here)
    exact = _run(case, "reference", torch.float64)  # its output gradient: randn of seed 1, as below
    grad = torch.randn(exact[0].shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    with isa.use(path):  # the two-pass backward: its key pass takes the time term by lanes
        got = torch.ops.grlib.hstu_attention_backward(grad, case["q"], case["k"], case["v"], case["offsets"], 150,
                                                      D ** -0.5, case["pos_bias"], case["time_bias"], ts, 2)
    for name, a, b in zip(["dq", "dk", "dv", "dpos_bias", "dtime_bias"], got, exact[1:]):
        torch.testing.assert_close(a.double(), b, **_tol(b, table=name.endswith("bias")),
                                   msg=lambda m: f"{path} mode 2 {name}: {m}")


@pytest.mark.parametrize("path", UNITS)
@settings(max_examples=30)
@given(case=batches(max_length=140, max_dim=40, dtypes=(torch.bfloat16,), max_buckets=48),
       mode=st.sampled_from([1, 2]), pad=st.sampled_from([0, 5]))
def test_bf16_backward_forms_on_strided_inputs(path, case, mode, pad):
    """Both backward forms (1: one pass per (sequence, head); 2: by query tile, then by key tile: its
    key pass takes the time term by lanes, time_bias up to 48 buckets) with q, k, v and dO as strided
    views (NaN in the gaps: a value read from outside the view would show)."""
    _units_or_skip(path)
    import grlib.ops.cpu.attention  # noqa: F401
    from grlib.ops.attention import default_alpha

    exact = _run(case, "reference", torch.float64)
    g = torch.randn(exact[0].shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    alpha = case["alpha"] if case["alpha"] is not None else default_alpha(case["q"].shape[2])
    time = case["time_bias"]
    with isa.use(path):
        got = torch.ops.grlib.hstu_attention_backward(
            _strided(g, pad), *(_strided(case[n], pad) for n in ("q", "k", "v")), case["offsets"],
            case["max_len"], alpha, case["pos_bias"], time, case["timestamps"] if time is not None else None, mode)
    for name, a, b in zip(["dq", "dk", "dv", "dpos_bias", "dtime_bias"], got, exact[1:]):
        if b is None:
            assert a.numel() == 0, name
            continue
        torch.testing.assert_close(a.double(), b, **_tol(b, table=name.endswith("bias")),
                                   msg=lambda m: f"{path} mode {mode} {name}: {m}")


@pytest.mark.parametrize("path", UNITS)
@settings(max_examples=25)
@given(lengths=st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, 130)), max_size=4),
       H=st.integers(1, 3), dh=st.sampled_from([1, 8, 24, 33]), seed=st.integers(0, 2**31 - 1))
def test_bf16_uvqk_matches_reference(path, lengths, H, dh, seed):
    """HSTU's fused SiLU + split + attention in bf16: SiLU(x) of q, k, v rounded to bf16 inside the
    kernel, gradients through SiLU' in float32, against the float64 unfused reference."""
    _units_or_skip(path)
    g = torch.Generator().manual_seed(seed)
    T, d = sum(lengths), H * dh
    z = torch.randn(T, 4 * d, generator=g).to(torch.bfloat16)
    offsets = ops.offsets_from_lengths(torch.tensor(lengths, dtype=torch.int64))
    pos = torch.randn(H, 9, generator=g)
    max_len = max([1, *lengths])
    gu, ga = torch.randn(T, d, generator=g), torch.randn(T, H, dh, generator=g)

    def run(z_in, impl):
        leaf = z_in.detach().requires_grad_(True)
        if impl == "reference":
            x = torch.nn.functional.silu(leaf)
            u, v, q, k = x.split(d, dim=1)
            attn = ops.hstu_attention(q.reshape(T, H, dh), k.reshape(T, H, dh), v.reshape(T, H, dh), offsets,
                                      max_len, alpha=0.5, pos_bias=pos.double(), impl="reference")
        else:
            u, attn = ops.uvqk_attention(leaf, H, offsets, max_len, 0.5, pos.to(z_in.dtype), impl="cpu")
        ((u * gu.to(u.dtype)).sum() + (attn * ga.to(attn.dtype)).sum()).backward()
        return [u.detach(), attn.detach(), leaf.grad]

    exact = run(z.double(), "reference")
    with isa.use(path):
        got = run(z, "cpu")
    for name, a, b in zip(["u", "attn", "dz"], got, exact):
        torch.testing.assert_close(a.double(), b, **_tol(b), msg=lambda m: f"{path} {name}: {m}")


def test_forced_paths_agree_bitwise_with_each_unit():
    """A path's result does not depend on the wider paths the CPU also has: amx run twice, and
    avx512_bf16 in this process and in a child started with GRLIB_ISA=avx512_bf16 (which limits oneDNN
    as an AVX512-BF16 CPU without AMX would be), give bitwise the same outputs; avx512 (bf16 converted to
    float32) differs from the units' products but meets the same bound."""
    paths = [p for p in UNITS if p in isa.available()]
    if not paths:
        pytest.skip(f"no bf16 units here ({', '.join(isa.available())}): needs avx512_bf16 or amx_bf16")
    case = dict(q=None)
    g = torch.Generator().manual_seed(5)
    lengths = [0, 1, 70, 130]
    T, H, D = sum(lengths), 2, 40
    q, k, v = (torch.randn(T, H, D, generator=g).to(torch.bfloat16) for _ in range(3))
    offsets = ops.offsets_from_lengths(torch.tensor(lengths))
    case = dict(q=q, k=k, v=v, offsets=offsets, max_len=130, alpha=None, pos_bias=torch.randn(H, 7, generator=g),
                time_bias=None, timestamps=None)
    first = {}
    for path in paths:
        with isa.use(path):
            first[path] = _run(case, "cpu")
            again = _run(case, "cpu")
        for a, b in zip(first[path], again):
            assert a is None or torch.equal(a, b), path
    if "avx512_bf16" in paths:
        code = ("import torch, sys; from tests.test_attention import _run; from grlib import ops; "
                "case = torch.load(sys.argv[1]); "
                "torch.save(_run(case, 'cpu'), sys.argv[2])")
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "case.pt"), os.path.join(tmp, "out.pt")
            torch.save(case, src)
            env = dict(os.environ, GRLIB_ISA="avx512_bf16", GRLIB_DPBF16_ATTENTION="1", OMP_NUM_THREADS="1")
            subprocess.run([sys.executable, "-c", code, src, dst], check=True, env=env, cwd=os.getcwd(), timeout=300)
            child = torch.load(dst)
        for a, b in zip(first["avx512_bf16"], child):
            assert a is None or torch.equal(a, b)
