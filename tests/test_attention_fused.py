"""Fused LayerNorm(x) * u (the HSTU step after attention): compiled kernel against the torch
reference, forward and all gradients (x, u, weight, bias); float64 gradcheck and opcheck.

Tolerance: against the reference evaluated in float64 on the same rounded inputs, the kernel's
largest error is at most twice that of torch's own LayerNorm * u in the same dtype, plus four
ulps of the largest value (rows far from zero mean make float32 itself lose digits).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib import ops


@st.composite
def rows(draw):
    N = draw(st.sampled_from([0, 1, draw(st.integers(2, 300))]))
    d = draw(st.integers(1, 70))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shift = draw(st.sampled_from([0.0, 50.0]))  # rows far from zero mean test the variance's stability
    x = (torch.randn(N, d, generator=g) * 2 + shift).to(dtype)
    u = torch.randn(N, d, generator=g).to(dtype)
    return x, u, torch.randn(d, generator=g), torch.randn(d, generator=g), draw(st.sampled_from([1e-5, 1e-2]))


def _run(x, u, w, b, eps, impl, dtype=None, dropout=None):
    """Outputs and gradients [y, dx, du, dweight, dbias] of layer_norm_mul, or of layer_norm_mul_dropout
    with dropout = (words, threshold, scale)."""
    cast = (lambda t: t.to(dtype)) if dtype else (lambda t: t)
    leaves = [cast(t).detach().requires_grad_(True) for t in (x, u, w, b)]
    if dropout is None:
        y = ops.layer_norm_mul(*leaves, eps=eps, impl=impl)
    else:
        y = ops.layer_norm_mul_dropout(*leaves, *dropout, eps=eps, impl=impl)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.dtype)
    y.backward(grad)
    return [y.detach()] + [t.grad for t in leaves]


def _assert_as_accurate_as_reference(case, dropout=None):
    """The kernel's error against the float64 answer at most twice the same-dtype reference's, plus a
    few ulps of the largest value; returns the kernel's [y, dx, du, dweight, dbias]."""
    x, u, w, b, eps = case
    exact = _run(x, u, w, b, eps, "reference", torch.float64, dropout)
    same = _run(x, u, w, b, eps, "reference", dropout=dropout)
    got = _run(x, u, w, b, eps, "cpu", dropout=dropout)
    ulp = torch.finfo(x.dtype).eps
    for name, a, r, e in zip(["y", "dx", "du", "dweight", "dbias"], got, same, exact):
        assert a.dtype == r.dtype, (name, a.dtype, r.dtype)
        if not e.numel():
            continue
        err, ref_err = (a.double() - e).abs().max(), (r.double() - e).abs().max()
        slack = 4 * ulp * (1 + float(e.abs().max()))
        assert err <= 2 * ref_err + slack, f"{name}: error {err:.3g} vs reference {ref_err:.3g} (+{slack:.3g})"
    return got


@given(case=rows())
def test_layer_norm_mul_matches_reference(case):
    """As accurate as torch's own LayerNorm * u in the same dtype: error against the float64 answer
    at most twice the reference's, plus a few ulps of the largest value."""
    _assert_as_accurate_as_reference(case)


def test_leading_dims_are_flattened_and_restored():
    x, u = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    w, b = torch.randn(5), torch.randn(5)
    torch.testing.assert_close(ops.layer_norm_mul(x, u, w, b, impl="cpu"),
                               ops.layer_norm_mul(x, u, w, b, impl="reference"), rtol=1e-5, atol=1e-6)


def test_gradcheck_float64_and_opcheck():
    import grlib.ops.cpu.fused  # noqa: F401

    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((7, 5), (7, 5), (5,), (5,))]
    assert torch.autograd.gradcheck(lambda x, u, w, b: torch.ops.grlib.layer_norm_mul(x, u, w, b, 1e-3)[0], leaves)
    f32 = [t.detach().float().requires_grad_(True) for t in leaves]
    torch.library.opcheck(torch.ops.grlib.layer_norm_mul.default, (*f32, 1e-5))


def test_auto_picks_compiled_kernel_on_cpu():
    assert ops.choose("layer_norm_mul", "cpu") == "cpu"


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("args,error,message", [
    ((torch.randn(4, 3), torch.randn(4, 2), torch.ones(3), torch.zeros(3)), ValueError, "one shape"),
    ((torch.randn(4, 3), torch.randn(4, 3).double(), torch.ones(3), torch.zeros(3)), TypeError, "floating dtype"),
    ((torch.randn(4, 3), torch.randn(4, 3), torch.ones(2), torch.zeros(3)), ValueError, "weight and bias must be"),
])
def test_bad_input_gets_a_clear_error(impl, args, error, message):
    with pytest.raises(error, match=message):
        ops.layer_norm_mul(*args, impl=impl)


@given(case=rows(), threshold=st.sampled_from([-32768, -20000, 0, 13107, 32767, 32768]), seed=st.integers(0, 99))
def test_layer_norm_mul_dropout_matches_reference(case, threshold, seed):
    """LayerNorm * u * dropout in one pass: as accurate as the two-op reference in the same dtype (the
    same bound as layer_norm_mul's), every mask from keep-all (-32768) to drop-all (32768)."""
    words = torch.randint(-32768, 32768, case[0].shape, dtype=torch.int16,
                          generator=torch.Generator().manual_seed(seed))
    scale = 65536 / (65536 - (threshold + 32768)) if threshold < 32768 else 0.0
    got = _assert_as_accurate_as_reference(case, (words, threshold, scale))
    dropped = words.to(torch.int32) < threshold
    assert (got[0][dropped] == 0).all() and (got[2][dropped] == 0).all()  # dropped: no output, no du


def test_layer_norm_mul_dropout_opcheck_and_bad_words():
    import grlib.ops.cpu.fused  # noqa: F401

    g = torch.Generator().manual_seed(0)
    x, u = torch.randn(7, 5, generator=g, requires_grad=True), torch.randn(7, 5, generator=g, requires_grad=True)
    w, b = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
    words = torch.randint(-32768, 32768, (7, 5), dtype=torch.int16, generator=g)
    torch.library.opcheck(torch.ops.grlib.layer_norm_mul_dropout.default, (x, u, w, b, 1e-5, words, 0, 2.0))
    with pytest.raises(ValueError, match="words must be int16 of x's shape"):
        ops.layer_norm_mul_dropout(x, u, w, b, words[:3], 0, 2.0)
    with pytest.raises(ValueError, match="threshold must be in"):
        ops.layer_norm_mul_dropout(x, u, w, b, words, 40000, 2.0)


def test_model_layer_uses_the_fused_dropout_with_the_same_words():
    """An HSTU layer in training mode draws the dropout words as FastDropout does (same generator
    stream) and applies them in the fused op: equal to the two-op composition on the same draw."""
    from grlib.config import ModelConfig
    from grlib.model.hstu import HSTULayer

    layer = HSTULayer(8, 2, 0.3, "reference").train()
    attn, u = torch.randn(6, 8), torch.randn(6, 8)
    torch.manual_seed(5)
    words, threshold, scale = layer.dropout.draw(attn.shape)
    fused = ops.layer_norm_mul_dropout(attn, u, layer.norm_attn.weight, layer.norm_attn.bias, words, threshold, scale)
    torch.manual_seed(5)
    two_ops = layer.dropout(layer.norm_attn(attn) * u)
    torch.testing.assert_close(fused, two_ops, rtol=1e-5, atol=1e-6)
    assert ModelConfig(name="hstu").dropout > 0  # the default model trains with dropout: the fused path runs
