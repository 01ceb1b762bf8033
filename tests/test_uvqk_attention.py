"""grlib.ops.uvqk_attention: HSTU's SiLU + split + attention from the projection z [T, 4d]. The fused
compiled kernel against the composition F.silu -> chunk -> padded reference attention, forward
(u and the attention) and backward (dz, both bias tables), on random ragged batches (empty and
length-1 sequences, several tiles, strided z); float64 gradcheck and opcheck; errors.

Tolerances as in test_attention.py (reference in float64 on the same rounded inputs)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from test_attention import _tol  # the same tolerances

import grlib.ops.cpu.attention  # noqa: F401,E402  (registers the fused op's autograd)


@st.composite
def cases(draw, max_length: int = 150):
    lengths = draw(st.lists(st.one_of(st.sampled_from([0, 1]), st.integers(0, max_length)), min_size=0, max_size=5))
    H = draw(st.integers(1, 3))
    D = draw(st.integers(1, 12))
    max_len = max(1, max(lengths, default=0)) + draw(st.sampled_from([0, 5]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    T, d = sum(lengths), H * D
    pad = draw(st.sampled_from([0, 7]))  # z as a strided view: rows of 4d + pad elements
    wide = (2 * torch.randn(T, 4 * d + pad, generator=g)).to(dtype)
    with_pos, with_time = draw(st.booleans()), draw(st.booleans())
    return dict(z=wide[:, :4 * d], H=H, offsets=ops.offsets_from_lengths(torch.tensor(lengths, dtype=torch.int64)),
                max_len=max_len, alpha=draw(st.sampled_from([None, 0.3])),
                pos_bias=torch.randn(H, draw(st.integers(1, 130)), generator=g).to(dtype) if with_pos else None,
                time_bias=torch.randn(H, 8, generator=g).to(dtype) if with_time else None,
                timestamps=torch.randint(0, 10**6, (T,), generator=g) if with_time else None)


def _run(case: dict, impl: str, dtype: torch.dtype | None = None):
    """(u, attn, dz, dpos, dtime) of one call with fixed random output gradients."""
    cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
    z = cast(case["z"]).detach().requires_grad_(True)
    tables = [cast(case[n]).detach().requires_grad_(True) if case[n] is not None else None
              for n in ("pos_bias", "time_bias")]
    u, attn = ops.uvqk_attention(z, case["H"], case["offsets"], case["max_len"], case["alpha"], tables[0], tables[1],
                                 case["timestamps"], impl=impl)
    g = torch.Generator().manual_seed(5)
    gu, ga = torch.randn(u.shape, generator=g).to(u.dtype), torch.randn(attn.shape, generator=g).to(attn.dtype)
    ((u * gu).sum() + (attn * ga).sum()).backward()
    return [u.detach(), attn.detach(), z.grad] + [t.grad if t is not None else None for t in tables]


@settings(max_examples=80, deadline=None)
@given(case=cases())
def test_fused_kernel_matches_the_composition(case):
    dtype = case["z"].dtype
    exact = _run(case, "reference", torch.float64)
    got = _run(case, "cpu")
    for name, a, b in zip(["u", "attn", "dz", "dpos_bias", "dtime_bias"], got, exact):
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert a.dtype == dtype and a.shape == b.shape, (name, a.dtype, a.shape)
        torch.testing.assert_close(a.double(), b, **_tol(dtype, b, table=name.endswith("bias")),
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("mode", [1, 2])
def test_both_backward_forms_write_dz(mode):
    """The one-pass and two-pass backward of the fused op agree with autograd of the composition."""
    g = torch.Generator().manual_seed(0)
    lengths = [200, 0, 1, 64, 65]
    T, H, D = sum(lengths), 2, 8
    z = torch.randn(T, 4 * H * D, generator=g, dtype=torch.float64)
    offsets = ops.offsets_from_lengths(torch.tensor(lengths))
    pos, time = torch.randn(H, 100, generator=g, dtype=torch.float64), torch.randn(H, 9, generator=g, dtype=torch.float64)
    ts = torch.randint(0, 10**5, (T,), generator=g)
    case = dict(z=z, H=H, offsets=offsets, max_len=200, alpha=0.5, pos_bias=pos, time_bias=time, timestamps=ts)
    exact = _run(case, "reference")
    gen = torch.Generator().manual_seed(5)
    gu, ga = torch.randn(T, H * D, generator=gen), torch.randn(T, H, D, generator=gen)
    got = torch.ops.grlib.hstu_uvqk_attention_backward(gu.double(), ga.double(), z, offsets, 200, 0.5, H, pos, time,
                                                       ts, mode)
    for a, b in zip(got, exact[2:]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gradcheck_float64_and_opcheck():
    g = torch.Generator().manual_seed(1)
    offsets = torch.tensor([0, 3, 3, 4, 9])
    T, H = 9, 2
    ts = torch.tensor([5, 1, 1, 7, 0, 40, 3, 3, 1000])
    z = torch.randn(T, 4 * H * 3, generator=g, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(H, 3, generator=g, dtype=torch.float64, requires_grad=True)
    time = torch.randn(H, 4, generator=g, dtype=torch.float64, requires_grad=True)
    op = torch.ops.grlib.hstu_uvqk_attention
    assert torch.autograd.gradcheck(lambda z, p, t: op(z, offsets, 6, 0.8, H, p, t, ts), (z, pos, time))
    torch.library.opcheck(op.default, (z.float().detach().requires_grad_(), offsets, 6, 0.8, H, None, None, None))
    torch.library.opcheck(op.default, (z.detach().requires_grad_(), offsets, 6, 0.8, H, pos, time, ts))
    gu, ga = torch.randn(T, H * 3, dtype=torch.float64), torch.randn(T, H, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.grlib.hstu_uvqk_attention_backward.default,
                          (gu, ga, z.detach(), offsets, 6, 0.8, H, pos.detach(), None, None))


def test_only_one_output_used():
    """A graph that uses u alone (or the attention alone) still gets the right dz."""
    g = torch.Generator().manual_seed(2)
    z = torch.randn(7, 16, generator=g, requires_grad=True)
    offsets = torch.tensor([0, 4, 7])
    for pick in (0, 1):
        grads = []
        for impl in ("cpu", "reference"):
            out = ops.uvqk_attention(z, 2, offsets, 4, impl=impl)[pick]
            grads.append(torch.autograd.grad(out.sum(), z)[0])
        torch.testing.assert_close(*grads, rtol=1e-4, atol=1e-5)


def test_bad_input_names_the_problem():
    offsets = torch.tensor([0, 3])
    with pytest.raises(ValueError, match="n_heads=3"):
        ops.uvqk_attention(torch.randn(3, 16), 3, offsets, 4, impl="cpu")
    with pytest.raises(ValueError, match="more than max_len=2"):
        ops.uvqk_attention(torch.randn(3, 16), 2, offsets, 2, impl="cpu")
    with pytest.raises(RuntimeError, match="z's width"):
        torch.ops.grlib.hstu_uvqk_attention(torch.randn(3, 18), offsets, 4, 1.0, 2, None, None, None)
