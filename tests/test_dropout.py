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


def _splitmix64_words(seed: int, elements: list[int]) -> list[int]:
    """The words of the stream in plain Python ints (a third implementation: the module doc's formula)."""
    mask = (1 << 64) - 1
    out = []
    for e in elements:
        z = (seed + ((e >> 2) + 1) * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        w = ((z ^ (z >> 31)) >> (16 * (e & 3))) & 0xFFFF
        out.append(w - 65536 if w >= 32768 else w)
    return out


def test_random_words_is_splitmix64():
    """SplittableRandom(0)'s first output is 0xE220A8397B1DCDAF (its published value): the stream's
    first four words are its four 16-bit parts, low first; every word matches the formula in Python."""
    seed = torch.tensor(0, dtype=torch.int64)
    first = [w & 0xFFFF for w in ops.random_words(seed, 1, 4, impl="cpu")[0].tolist()]
    assert first == [0xCDAF, 0x7B1D, 0xA839, 0xE220]
    for s in (0, 12345, -(2**63), 2**63 - 1):
        got = ops.random_words(torch.tensor(s, dtype=torch.int64), 7, 9, impl="cpu").view(-1).tolist()
        assert got == _splitmix64_words(s % 2**64, list(range(63))), s


@settings(max_examples=40, deadline=None)
@given(n_rows=st.integers(0, 40), inner=st.integers(0, 37), seed=st.integers(-(2**63), 2**63 - 1),
       with_rows=st.booleans(), pick=st.integers(0, 2**31))
def test_random_words_kernel_equals_reference_and_rows_are_the_batch_rows(n_rows, inner, seed, with_rows, pick):
    """impl cpu equals impl reference bitwise; with `rows`, each row is that row of the whole batch's
    words (what a data-parallel rank draws for its tokens)."""
    s = torch.tensor(seed, dtype=torch.int64)
    whole = ops.random_words(s, n_rows, inner, impl="reference")
    assert whole.dtype == torch.int16 and whole.shape == (n_rows, inner)
    assert torch.equal(ops.random_words(s, n_rows, inner, impl="cpu"), whole)
    if with_rows and n_rows:
        rows = torch.randint(0, n_rows, (n_rows // 2 + 1,), generator=torch.Generator().manual_seed(pick))
        for impl in ("cpu", "reference"):
            assert torch.equal(ops.random_words(s, len(rows), inner, rows, impl=impl), whole[rows]), impl


def test_random_words_uniform_16_bit_words():
    """Chi-square over the 256 values of each byte of 2**20 words (4 x 2**18 64-bit outputs), and of each
    byte of the difference between a word and the same lane of the next output: within the 1e-6 tail of
    chi2(255). The words alone pass even without the mixer's multiplications (a Weyl sequence is
    equidistributed: chi2 118 and 54, checked in numpy); the differences do not (chi2 8.5M and 33M there,
    269 and 269 with the mixer)."""
    words = ops.random_words(torch.tensor(42, dtype=torch.int64), 1024, 1024).view(-1).to(torch.int32) & 0xFFFF
    steps = (words[4:] - words[:-4]) & 0xFFFF  # [2**20 - 4]: each word against its lane in the next output
    for byte in (words & 0xFF, words >> 8, steps & 0xFF, steps >> 8):
        counts = torch.bincount(byte, minlength=256).double()
        expected = byte.numel() / 256
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 400, chi2  # chi2(255): mean 255, sd 22.6; P(> 400) < 1e-6


def test_random_words_opcheck_and_errors():
    import grlib.ops.cpu.dropout  # noqa: F401  (fake impl of the compiled op)

    assert ops.choose("random_words", "cpu") == "cpu"
    s = torch.tensor(3, dtype=torch.int64)
    torch.library.opcheck(torch.ops.grlib.random_words.default, (s, 4, 5, None))
    torch.library.opcheck(torch.ops.grlib.random_words.default, (s, 2, 5, torch.tensor([3, 0])))
    with pytest.raises(ValueError, match="seed must be one int64"):
        ops.random_words(torch.tensor(3.0), 2, 2)
    with pytest.raises(ValueError, match=r"rows must be int64 \[n_rows=2\]"):
        ops.random_words(s, 2, 2, torch.tensor([1]))
    with pytest.raises(ValueError, match="n_rows and inner must be >= 0"):
        ops.random_words(s, -1, 2)
