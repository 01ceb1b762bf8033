"""grlib.model.dropout.FastDropout against its definition (x * mask / (1 - k / 65536)), forward and
backward on random shapes (hypothesis, incl. empty and length-1), its drop rate (binomial test),
unbiasedness, determinism under torch.manual_seed, and nn.Dropout's train / eval behaviour; the op
grlib.ops.dropout_words: compiled kernel against the torch reference, opcheck, argument errors."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops
from grlib.model.dropout import WORDS, FastDropout, drop_count, fast_dropout, keep_mask, random_words


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 37), min_size=1, max_size=3), p=st.floats(0.0, 1.0),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31))
def test_matches_its_definition_forward_and_backward(shape, p, dtype, seed):
    """The compiled one-pass kernel (CPU) equals x * mask * scale bitwise, forward and backward."""
    x = torch.randn(*shape, dtype=torch.float64).to(dtype).requires_grad_(True)
    g = torch.randn(*shape, dtype=torch.float64).to(dtype)
    torch.manual_seed(seed)
    y = fast_dropout(x, p)
    (y * g).sum().backward()
    torch.manual_seed(seed)
    mask = keep_mask(x.shape, p) if p > 0 else torch.ones(x.shape, dtype=torch.bool)
    k = drop_count(p)
    scale = WORDS / (WORDS - k) if k < WORDS else 0.0
    torch.testing.assert_close(y, x.detach() * mask * scale, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, g * mask * scale, rtol=0, atol=0)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_drop_rate_is_p_binomial(p):
    torch.manual_seed(0)
    n = 4_000_003  # not a multiple of 4: the last 64-bit word is used in part
    dropped = int((~keep_mask(torch.Size([n]), p)).sum())
    q = drop_count(p) / WORDS
    assert abs(q - p) <= 2**-17
    assert abs(dropped - n * q) < 5 * math.sqrt(n * q * (1 - q))


def test_unbiased_and_not_a_constant_mask():
    torch.manual_seed(1)
    x = torch.full((2000, 64), 3.0)
    masks = [fast_dropout(x, 0.3) != 0 for _ in range(3)]
    assert not torch.equal(masks[0], masks[1])  # fresh draws per call
    mean = torch.stack([fast_dropout(x, 0.3) for _ in range(20)]).mean()
    assert abs(float(mean) - 3.0) < 0.01


def test_module_train_eval_and_determinism():
    m = FastDropout(0.25)
    x = torch.randn(100, 8)
    m.eval()
    assert m(x) is x
    m.train()
    torch.manual_seed(7)
    a = m(x)
    torch.manual_seed(7)
    assert torch.equal(a, m(x))
    assert torch.equal(FastDropout(0.0)(x), x)
    assert torch.equal(fast_dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="dropout probability"):
        FastDropout(1.5)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 37), min_size=0, max_size=3),
       threshold=st.one_of(st.sampled_from([-32768, -32767, 0, 32767, 32768]), st.integers(-32768, 32768)),
       scale=st.sampled_from([0.0, 1.0, 1.25, 1 / 0.9]),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.bfloat16, torch.float16]),
       strided=st.booleans(), seed=st.integers(0, 2**31))
def test_dropout_words_kernel_equals_reference(shape, threshold, scale, dtype, strided, seed):
    """impl cpu (the one-pass kernel) equals impl reference (x * (words >= threshold) * scale) bitwise,
    forward and backward (the gradient of each: its own autograd), on random shapes incl. empty and
    length-1, every threshold edge, strided x."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, 2, generator=g, dtype=torch.float64).to(dtype)
    x = x[..., 0] if strided else x[..., 0].contiguous()
    words = torch.randint(-32768, 32768, x.shape, generator=g, dtype=torch.int32).to(torch.int16)
    grad = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    outs = []
    for impl in ("reference", "cpu"):
        leaf = x.detach().requires_grad_(True)
        y = ops.dropout_words(leaf, words, threshold, scale, impl=impl)
        y.backward(grad)
        outs.append((y.detach(), leaf.grad))
    (y_ref, g_ref), (y_cpu, g_cpu) = outs
    assert y_cpu.dtype == dtype and y_cpu.shape == x.shape
    torch.testing.assert_close(y_cpu, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(g_cpu, g_ref, rtol=0, atol=0)


def test_dropout_words_dispatch_opcheck_and_errors():
    import grlib.ops.cpu.dropout  # noqa: F401  (fake impl and autograd of the compiled op)

    assert ops.choose("dropout_words", "cpu") == "cpu"
    assert ops.implementations("dropout_words") == ("reference", "cpu")
    torch.manual_seed(0)
    for shape in ((5, 3), (0,), (1,)):
        x = torch.randn(shape, requires_grad=True)
        torch.library.opcheck(torch.ops.grlib.dropout_words.default, (x, random_words(x.shape), -3000, 1.1))
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match="words must be int16 of x's shape"):
        ops.dropout_words(x, random_words(torch.Size([12])), 0, 1.0)
    with pytest.raises(ValueError, match="threshold must be in"):
        ops.dropout_words(x, random_words(x.shape), 32769, 1.0)
    with pytest.raises(TypeError, match="x must be floating point"):
        ops.dropout_words(x.long(), random_words(x.shape), 0, 1.0)
