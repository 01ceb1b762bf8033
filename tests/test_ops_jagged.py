"""Compiled and fbgemm jagged ops against the padded reference: forward and backward, on random
ragged batches (empty and length-1 sequences included), several dtypes; gradcheck in float64."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib import ops

IMPLS = ["cpu", "fbgemm"]
FBGEMM_DTYPES = (torch.float32, torch.bfloat16)  # fbgemm's CPU jagged kernels have no float64
# Tolerances: conversions copy values exactly; reductions accumulate in float (bf16 rounds once).
TOL = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-12), torch.bfloat16: (1e-2, 1e-2)}


@st.composite
def ragged(draw, max_batch: int = 6, max_length: int = 9, max_dim: int = 5,
           dtypes=(torch.float32, torch.float64, torch.bfloat16)):
    lengths = draw(st.lists(st.integers(0, max_length), min_size=0, max_size=max_batch))
    dim = draw(st.integers(1, max_dim))
    max_len = draw(st.integers(0, max_length + 1))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(dtypes))
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(sum(lengths), dim, generator=g).to(dtype)
    return values, ops.offsets_from_lengths(torch.tensor(lengths, dtype=torch.int64)), max_len


def _grads(fn, values: torch.Tensor, seed: int = 0):
    x = values.detach().clone().requires_grad_(True)
    out = fn(x)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    out.backward(g)
    return out.detach(), x.grad


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    rtol, atol = TOL[a.dtype]
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_jagged_to_padded_matches_reference(impl, data):
    case = data.draw(ragged(dtypes=FBGEMM_DTYPES if impl == "fbgemm" else tuple(TOL)))
    values, offsets, max_len = case
    ref_out, ref_grad = _grads(lambda v: ops.jagged_to_padded(v, offsets, max_len, -1.5, impl="reference"), values)
    out, grad = _grads(lambda v: ops.jagged_to_padded(v, offsets, max_len, -1.5, impl=impl), values)
    _close(out, ref_out)
    _close(grad, ref_grad)


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_padded_to_jagged_matches_reference(impl, data):
    case = data.draw(ragged(dtypes=FBGEMM_DTYPES if impl == "fbgemm" else tuple(TOL)))
    values, offsets, max_len = case
    B = offsets.numel() - 1
    padded = torch.randn(B, max_len, values.shape[1]).to(values.dtype)
    total = values.shape[0]
    ref_out, ref_grad = _grads(lambda p: ops.padded_to_jagged(p, offsets, total, impl="reference"), padded)
    out, grad = _grads(lambda p: ops.padded_to_jagged(p, offsets, total, impl=impl), padded)
    _close(out, ref_out)
    _close(grad, ref_grad)


@pytest.mark.parametrize("impl", IMPLS)
@given(data=st.data())
def test_segment_sum_matches_reference(impl, data):
    case = data.draw(ragged(dtypes=FBGEMM_DTYPES if impl == "fbgemm" else tuple(TOL)))
    values, offsets, _ = case
    ref_out, ref_grad = _grads(lambda v: ops.segment_sum(v, offsets, impl="reference"), values)
    out, grad = _grads(lambda v: ops.segment_sum(v, offsets, impl=impl), values)
    _close(out, ref_out)
    _close(grad, ref_grad)


@given(case=ragged())
def test_segment_expand_and_mean_match_reference(case):
    values, offsets, _ = case
    x = torch.randn(offsets.numel() - 1, values.shape[1]).to(values.dtype)
    for fn in (lambda t, i: ops.segment_expand(t, offsets, values.shape[0], impl=i),):
        ref_out, ref_grad = _grads(lambda t: fn(t, "reference"), x)
        out, grad = _grads(lambda t: fn(t, "cpu"), x)
        _close(out, ref_out)
        _close(grad, ref_grad)
    ref_out, ref_grad = _grads(lambda v: ops.segment_mean(v, offsets, impl="reference"), values)
    out, grad = _grads(lambda v: ops.segment_mean(v, offsets, impl="cpu"), values)
    _close(out, ref_out)
    _close(grad, ref_grad)


def test_known_values_with_empty_and_single_sequences():
    values = torch.arange(1.0, 5.0).unsqueeze(1)  # [4, 1]
    offsets = torch.tensor([0, 0, 1, 4])  # lengths 0, 1, 3
    padded = ops.jagged_to_padded(values, offsets, 2, impl="cpu")[..., 0]
    assert padded.tolist() == [[0, 0], [1, 0], [2, 3]]  # the third sequence is cut at max_len 2
    assert ops.segment_sum(values, offsets, impl="cpu")[:, 0].tolist() == [0, 1, 9]
    assert ops.segment_mean(values, offsets, impl="cpu")[:, 0].tolist() == [0, 1, 3]
    back = ops.padded_to_jagged(torch.ones(3, 2, 1), offsets, 4, impl="cpu")[:, 0]
    assert back.tolist() == [1, 1, 1, 0]  # the token past N=2 reads as 0


def test_multi_feature_dims_are_restored():
    values = torch.randn(7, 2, 3)
    offsets = torch.tensor([0, 3, 7])
    out = ops.jagged_to_padded(values, offsets, 4, impl="cpu")
    assert out.shape == (2, 4, 2, 3)
    torch.testing.assert_close(ops.padded_to_jagged(out, offsets, impl="cpu"), values)


@pytest.mark.parametrize("name,fn", [
    ("jagged_to_padded", lambda v, o: torch.ops.grlib.jagged_to_padded(v, o, 4, 0.0)),
    ("padded_to_jagged", lambda v, o: torch.ops.grlib.padded_to_jagged(
        torch.ops.grlib.jagged_to_padded(v, o, 3, 0.0), o, v.shape[0])),
    ("segment_sum", lambda v, o: torch.ops.grlib.segment_sum(v, o)),
    ("segment_expand", lambda v, o: torch.ops.grlib.segment_expand(torch.ops.grlib.segment_sum(v, o), o, v.shape[0])),
])
def test_gradcheck_float64(name, fn):
    import grlib.ops.cpu.jagged  # noqa: F401

    offsets = torch.tensor([0, 2, 2, 3, 7])
    values = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: fn(v, offsets), (values,)), name


def test_opcheck_compiled_ops():
    """Schema, fake (meta) implementations and autograd registration agree with the kernels."""
    import grlib.ops.cpu.jagged  # noqa: F401

    offsets = torch.tensor([0, 2, 2, 5])
    values = torch.randn(5, 3, requires_grad=True)
    torch.library.opcheck(torch.ops.grlib.jagged_to_padded.default, (values, offsets, 4, 0.0))
    torch.library.opcheck(torch.ops.grlib.padded_to_jagged.default, (torch.randn(3, 4, 3, requires_grad=True), offsets, 5))
    torch.library.opcheck(torch.ops.grlib.segment_sum.default, (values, offsets))
    torch.library.opcheck(torch.ops.grlib.segment_expand.default, (torch.randn(3, 3, requires_grad=True), offsets, 5))


@pytest.mark.parametrize("offsets,message", [
    (torch.tensor([1, 2, 5]), "offsets\\[0\\] must be 0"),
    (torch.tensor([0, 3, 2, 5]), "non-decreasing"),
    (torch.tensor([0, 2, 4]), "must equal the number of jagged rows 5"),
    (torch.tensor([0, 2, 5], dtype=torch.int32), "int64"),
])
def test_bad_offsets_get_clear_errors(offsets, message):
    with pytest.raises((RuntimeError, ValueError), match=message):
        ops.jagged_to_padded(torch.randn(5, 2), offsets, 3, impl="cpu")


def test_bad_arguments_get_clear_errors():
    offsets = torch.tensor([0, 2, 5])
    with pytest.raises(ValueError, match="max_len must be >= 0"):
        ops.jagged_to_padded(torch.randn(5, 2), offsets, -1)
    with pytest.raises(ValueError, match="padded must be \\[B=2"):
        ops.padded_to_jagged(torch.randn(3, 4, 2), offsets)
    with pytest.raises(RuntimeError, match="floating point"):
        ops.segment_sum(torch.ones(5, 2, dtype=torch.int64), offsets, impl="cpu")
    with pytest.raises(TypeError, match="no float64 kernels"):
        ops.segment_sum(torch.randn(5, 2, dtype=torch.float64), offsets, impl="fbgemm")
    with pytest.raises(ValueError, match="implementation 'triton' is not available"):
        ops.segment_sum(torch.randn(5, 2), offsets, impl="triton")


def test_dispatcher_prefers_compiled_kernel_on_cpu():
    assert ops.choose("jagged_to_padded", "cpu") == "cpu"
    assert ops.choose("jagged_to_padded", "cuda") == "fbgemm"
    assert ops.implementations("segment_sum") == ("reference", "fbgemm", "cpu")


def test_preferring_puts_one_implementation_first_for_auto_only():
    from grlib.ops import registry

    with registry.preferring("reference"):
        assert ops.choose("jagged_to_padded", "cpu") == "reference"
        assert ops.choose("dropout_words", "cpu") == "reference"
        assert ops.choose("jagged_to_padded", "cpu", "cpu") == "cpu"  # an explicit name is kept
    with registry.preferring("triton"):  # registered for hstu_attention, but not on CPU
        assert ops.choose("hstu_attention", "cpu") == "cpu"
    assert ops.choose("jagged_to_padded", "cpu") == "cpu"  # restored on exit
    with pytest.raises(ValueError, match="unknown implementation 'mkl'"):
        with registry.preferring("mkl"):
            pass
