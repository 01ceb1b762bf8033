"""The full-softmax option of the negative path (negatives.softmax: full | auto): loss and gradients
against a plain PyTorch reference on padded [B, N, d] tensors (F.cross_entropy over every real item,
hypothesis: ragged batches incl. empty batches, empty and length-1 sequences, tokens without a
target), the "auto" rule, no sampler draw, and the same numbers prepared ahead."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.config import ConfigError, NegativesConfig
from grlib.schema import FIRST_ITEM_ID
from grlib.jagged import JaggedBatch
from grlib.negatives import build_negative_path
from grlib.ops import jagged_to_padded


class Table:
    """model.embed stand-in (an ItemTable): L2-normalised rows of a raw weight, as Embeddings.lookup."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.weight.index_select(0, ids), dim=-1)


def make_batch(lengths: list[int], targets: torch.Tensor) -> JaggedBatch:
    T = int(sum(lengths))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int64)
    zeros = torch.zeros(T, dtype=torch.int64)
    return JaggedBatch(item_ids=zeros, actions=zeros, timestamps=zeros, offsets=offsets,
                       max_len=max(lengths, default=1) or 1, targets=targets)


def padded_reference(user: torch.Tensor, weight: torch.Tensor, batch: JaggedBatch, temperature: float) -> torch.Tensor:
    """Plain PyTorch on padded tensors: [B, N, d] users x every normalised real item -> [B, N, V-2]
    logits, F.cross_entropy over the tokens with a target (padding and target 0 ignored)."""
    N = batch.max_len
    up = jagged_to_padded(user, batch.offsets, N)  # [B, N, d]
    tp = jagged_to_padded(batch.targets[:, None].double(), batch.offsets, N).squeeze(-1).long()  # [B, N], 0 = none
    items = F.normalize(weight[FIRST_ITEM_ID:], dim=-1)  # [V-2, d]
    logits = up @ items.T / temperature  # [B, N, V-2]
    labels = torch.where(tp > 0, tp - FIRST_ITEM_ID, torch.full_like(tp, -100))  # [B, N]
    if not bool((labels >= 0).any()):
        return user.sum() * 0.0 + weight.sum() * 0.0  # no target: cross_entropy would give nan
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


@st.composite
def cases(draw):
    V = draw(st.integers(FIRST_ITEM_ID + 1, 40))
    lengths = draw(st.lists(st.integers(0, 9), min_size=0, max_size=6))
    T = sum(lengths)
    targets = draw(st.lists(st.one_of(st.just(0), st.integers(FIRST_ITEM_ID, V - 1)), min_size=T, max_size=T))
    # d >= 2: a normalised 1-d row is +-1, its true gradient 0 and the computed one rounding noise alone
    return {"V": V, "d": draw(st.sampled_from([2, 4, 16])), "lengths": lengths,
            "targets": torch.tensor(targets, dtype=torch.int64), "seed": draw(st.integers(0, 2**16)),
            "temperature": draw(st.sampled_from([0.05, 1.0])),
            "sampler": draw(st.sampled_from(["uniform", "popularity", "in-batch"])),
            "sharing": draw(st.sampled_from(["per-token", "shared"]))}


def _inputs(case):
    g = torch.Generator().manual_seed(case["seed"])
    T = int(sum(case["lengths"]))
    user = F.normalize(torch.randn(T, case["d"], generator=g), dim=-1).requires_grad_()  # [T, d]
    # [V, d] raw rows of norm 0.5..2 (the normalisation's backward divides by the norm)
    norms = 0.5 + 1.5 * torch.rand(case["V"], 1, generator=g)
    weight = (F.normalize(torch.randn(case["V"], case["d"], generator=g), dim=-1) * norms).requires_grad_()
    counts = torch.randint(0, 20, (case["V"],), generator=g).numpy()
    return user, weight, counts, make_batch(case["lengths"], case["targets"])


@settings(max_examples=60)
@given(cases())
def test_full_softmax_matches_the_padded_cross_entropy(case):
    """Loss, dL/duser and dL/dweight of softmax "full" equal F.cross_entropy over every real item on the
    padded batch, whatever the sampler and sharing (neither is used)."""
    user, weight, counts, batch = _inputs(case)
    cfg = NegativesConfig(sampler=case["sampler"], sharing=case["sharing"], n_negatives=3, softmax="full",
                          temperature=case["temperature"])
    path = build_negative_path(cfg, case["V"], counts, seed=case["seed"])
    assert path.full and path.logq is None
    loss = path.loss(user, Table(weight), batch)
    got = torch.autograd.grad(loss, [user, weight], allow_unused=True, materialize_grads=True)
    ref = padded_reference(user, weight, batch, case["temperature"])
    expect = torch.autograd.grad(ref, [user, weight], allow_unused=True, materialize_grads=True)
    assert loss.shape == () and torch.isfinite(loss)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(got, expect):  # logits scale with 1/temperature, and so does the rounding of a gradient
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-6 / case["temperature"])
    if not bool((case["targets"] > 0).any()):  # an empty batch, or no token with a target
        assert float(loss.detach()) == 0.0 and all(not bool(a.any()) for a in got)


def test_full_softmax_of_a_large_batch_spans_chunks_and_matches():
    """P = 700 tokens x V - 2 = 2,000 items: more than one chunk of the fused shared path."""
    g = torch.Generator().manual_seed(5)
    V, d, lengths = 2002, 8, [300, 0, 1, 399]
    targets = torch.randint(FIRST_ITEM_ID, V, (700,), generator=g)
    targets[::7] = 0
    user = F.normalize(torch.randn(700, d, generator=g), dim=-1).requires_grad_()
    weight = torch.randn(V, d, generator=g).requires_grad_()
    batch = make_batch(lengths, targets)
    path = build_negative_path(NegativesConfig(softmax="full"), V)
    loss = path.loss(user, Table(weight), batch)
    ref = padded_reference(user, weight, batch, 0.05)
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(loss, [user, weight]), torch.autograd.grad(ref, [user, weight])):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_full_softmax_in_half_precision_is_near_fp32(precision):
    g = torch.Generator().manual_seed(1)
    V, d = 60, 8
    targets = torch.randint(FIRST_ITEM_ID, V, (30,), generator=g)
    user = F.normalize(torch.randn(30, d, generator=g), dim=-1)
    weight = torch.randn(V, d, generator=g)
    batch = make_batch([12, 18], targets)
    full = build_negative_path(NegativesConfig(softmax="full", precision=precision), V).loss(user, Table(weight), batch)
    ref = padded_reference(user, weight, batch, 0.05)
    assert abs(float(full - ref)) <= 2 * 20 * {"fp16": 2.0**-11, "bf16": 2.0**-8}[precision]  # as test_negatives


@pytest.mark.parametrize("softmax, V, R, full", [
    ("sampled", 10, 64, False), ("full", 10**6, 64, True),
    ("auto", 1684, 2048, True), ("auto", 2050, 2048, True), ("auto", 2051, 2048, False), ("auto", 5002, 2048, False),
])
def test_auto_is_full_where_the_catalogue_fits_the_pool(softmax, V, R, full):
    """auto: full where the V - 2 real items are no more than n_negatives (ML-100K's 1,682 items under
    the laptop pool of 2,048; not the synthetic twin's 5,000)."""
    cfg = NegativesConfig(softmax=softmax, n_negatives=R)
    assert cfg.full_softmax(V) is full


def test_an_unknown_softmax_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"negatives.softmax: 'partial' is not one of \('sampled', 'full', 'auto'\)"):
        NegativesConfig(softmax="partial")


def test_full_softmax_draws_nothing_and_prepared_equals_inline():
    """No sampler draw (the generator state never moves), the pool is every real item, and a sample
    prepared ahead (async schedule) gives the inline loss bit for bit."""
    g = torch.Generator().manual_seed(2)
    V, d = 30, 4
    targets = torch.tensor([0, 5, 7, 2, 29, 0])
    user = F.normalize(torch.randn(6, d, generator=g), dim=-1)
    weight = torch.randn(V, d, generator=g)
    path = build_negative_path(NegativesConfig(softmax="full", sampler="popularity"), V, np.arange(V), seed=3)
    before = path.state_dict()["generator"].clone()
    sample = path.sample(make_batch([6], targets))
    assert torch.equal(sample.ids, torch.arange(FIRST_ITEM_ID, V))
    assert torch.equal(sample.keep, torch.tensor([1, 2, 3, 4]))
    inline = path.loss(user, Table(weight), make_batch([6], targets))
    prepared = make_batch([6], targets)
    path.prepare(prepared)
    assert torch.equal(path.loss(user, Table(weight), prepared), inline)
    assert torch.equal(path.state_dict()["generator"], before) and torch.equal(path.generator.get_state(), before)
