"""grlib.model.dropout.FastDropout against its definition (x * mask / (1 - k / 65536)), forward and
backward on random shapes (hypothesis, incl. empty and length-1), its drop rate (binomial test),
unbiasedness, determinism under torch.manual_seed, and nn.Dropout's train / eval behaviour."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.model.dropout import WORDS, FastDropout, drop_count, fast_dropout, keep_mask


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
