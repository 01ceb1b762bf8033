"""grlib.ops.layer_norm (LayerNorm, then optional L2 normalisation, in x's dtype or bf16): the
compiled kernel against the torch reference (F.layer_norm, F.normalize, .to(dtype)), forward and
every gradient (x, weight, bias), on random row counts (empty and one row included) and widths;
float64 gradcheck and opcheck; the HSTU encoder's output equals the unfused formula.

Tolerance: against the reference evaluated in float64 on the same rounded inputs (and the same
rounded incoming gradient), the kernel's largest error is at most twice that of the reference run
in the kernel's dtypes, plus four ulps of the largest value in the output's dtype: a bf16 output is
the float32 value rounded once, and where the kernel's float32 value and the reference's lie on the
two sides of a rounding boundary the two outputs differ by one bf16 ulp.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from grlib import ops

# (x dtype, output dtype): the same dtype, or float32 x written as bf16 (a bf16 projection's input)
DTYPES = [(torch.float32, None), (torch.bfloat16, None), (torch.float32, torch.bfloat16)]


@st.composite
def cases(draw):
    N = draw(st.sampled_from([0, 1, draw(st.integers(2, 200))]))
    d = draw(st.integers(1, 70))
    x_dtype, out_dtype = draw(st.sampled_from(DTYPES))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    shift = draw(st.sampled_from([0.0, 50.0]))  # rows far from zero mean test the variance's stability
    x = (torch.randn(N, d, generator=g) * 2 + shift).to(x_dtype)
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    l2 = draw(st.sampled_from([None, 1e-12, 1e-3]))
    return x, w, b, draw(st.sampled_from([1e-5, 1e-2])), l2, out_dtype


def _run(x, w, b, eps, l2, dtype, impl, cast=None):
    """[y, dx, dweight, dbias]; cast: evaluate in that dtype (the float64 answer), on the same values."""
    leaves = [(t.to(cast) if cast else t).detach().requires_grad_(True) for t in (x, w, b)]
    y = ops.layer_norm(*leaves, eps=eps, l2_eps=l2, dtype=None if cast else dtype, impl=impl)
    # the incoming gradient as the kernel gets it (rounded to its output's dtype), for every run
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype or x.dtype)
    y.backward(grad.to(y.dtype))
    return [y.detach()] + [t.grad for t in leaves]


@given(cases())
def test_layer_norm_matches_reference(case):
    x, w, b, eps, l2, dtype = case
    exact = _run(x, w, b, eps, l2, dtype, "reference", cast=torch.float64)
    same = _run(x, w, b, eps, l2, dtype, "reference")
    got = _run(x, w, b, eps, l2, dtype, "cpu")
    for name, a, r, e in zip(["y", "dx", "dweight", "dbias"], got, same, exact):
        assert a.dtype == r.dtype and a.shape == r.shape, (name, a.dtype, r.dtype)
        if not e.numel():
            continue
        err, ref_err = (a.double() - e).abs().max(), (r.double() - e).abs().max()
        slack = 4 * torch.finfo(a.dtype).eps * (1 + float(e.abs().max()))
        assert err <= 2 * ref_err + slack, f"{name}: error {err:.3g} vs reference {ref_err:.3g} (+{slack:.3g})"


@pytest.mark.parametrize("l2", [None, 1e-12])
def test_layer_norm_gradcheck_and_opcheck(l2):
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True) for s in ((5, 7), (7,), (7,))]
    assert torch.autograd.gradcheck(lambda x, w, b: torch.ops.grlib.layer_norm(x, w, b, 1e-3, l2, None)[0], leaves)
    x, w, b = (t.detach().float() for t in leaves)
    torch.library.opcheck(torch.ops.grlib.layer_norm.default, (x, w, b, 1e-5, l2, None))
    torch.library.opcheck(torch.ops.grlib.layer_norm.default, (x, w, b, 1e-5, l2, torch.bfloat16))


def test_a_row_under_the_l2_eps_is_divided_by_it_and_passes_no_norm_gradient():
    """A row whose LayerNorm output is below l2_eps (weight and bias zero but one tiny bias entry):
    y = z / l2_eps and dz = g / l2_eps, as F.normalize's clamp_min, in float64 against the reference."""
    x = torch.randn(3, 6, dtype=torch.float64)
    w, b = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    b[2] = 1e-9
    for impl in ("cpu", "reference"):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        y = ops.layer_norm(*leaves, l2_eps=1e-6, impl=impl)
        torch.testing.assert_close(y.detach()[:, 2], torch.full((3,), 1e-3, dtype=torch.float64))
        y.backward(torch.ones_like(y))
        torch.testing.assert_close(leaves[2].grad, torch.full((6,), 3e6, dtype=torch.float64))
        torch.testing.assert_close(leaves[0].grad, torch.zeros_like(x))  # zero weight: no gradient reaches x


def test_bad_input_names_the_parameter():
    x, w = torch.randn(4, 5), torch.randn(5)
    with pytest.raises(ValueError, match=r"weight and bias must be \[d=5\]"):
        ops.layer_norm(x, w, torch.randn(4))
    with pytest.raises(ValueError, match="l2_eps must be > 0"):
        ops.layer_norm(x, w, w, l2_eps=0.0)
    with pytest.raises(TypeError, match="dtype must be x's"):
        ops.layer_norm(x.bfloat16(), w, w, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="l2_eps must be > 0"):  # the kernel checks it too
        torch.ops.grlib.layer_norm(x, w, w, 1e-5, -1.0, None)


def test_auto_takes_the_kernel_on_cpu():
    assert ops.choose("layer_norm", "cpu") == "cpu"


def test_the_encoder_output_is_the_unfused_formula():
    """HSTU's final LayerNorm + L2 normalisation (one op now) against F.normalize(LayerNorm(x)), and
    its layers' input LayerNorm in bf16 against LayerNorm(x).to(bf16)."""
    from grlib.model.hstu import L2_EPS

    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(50, 48, generator=g), torch.randn(48, generator=g), torch.randn(48, generator=g)
    unfused = F.normalize(F.layer_norm(x, (48,), w, b, 1e-5), dim=-1)
    torch.testing.assert_close(ops.layer_norm(x, w, b, 1e-5, l2_eps=L2_EPS), unfused, rtol=1e-5, atol=1e-6)
    as_bf16 = F.layer_norm(x, (48,), w, b, 1e-5).to(torch.bfloat16)
    got = ops.layer_norm(x, w, b, 1e-5, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), as_bf16.float(), rtol=2**-7, atol=2**-7)
