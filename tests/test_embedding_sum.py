"""grlib.ops.embedding_sum (a token's three lookups summed, one op): the compiled CPU kernel against
the torch reference, forward and backward, bitwise, on random shapes (hypothesis: empty and one-token
batches, padding rows, repeated ids); opcheck; argument errors; the model's embeddings use it."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib import ops


def _inputs(T, d, V, A, G, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    tables = [torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True) for n in (V, A, G)]
    idx = [torch.randint(0, n, (T,), generator=g) for n in (V, A, G)]
    grad = torch.randn(T, d, generator=g, dtype=torch.float64).to(dtype)
    return tables, idx, grad


def _run(impl, tables, idx, grad, scale, padding_idx):
    leaves = [t.detach().clone().requires_grad_(True) for t in tables]
    out = ops.embedding_sum(*leaves, *idx, scale, padding_idx, impl=impl)
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves]


@settings(max_examples=80, deadline=None)
@given(T=st.sampled_from([0, 1, 2, 7, 64, 300]), d=st.sampled_from([1, 8, 17, 64]), V=st.integers(1, 600),
       A=st.integers(1, 300), G=st.integers(1, 40), dtype=st.sampled_from([torch.float32, torch.float64]),
       scale=st.sampled_from([1.0, 8.0, math.sqrt(96), 0.3]), padding=st.sampled_from([None, 0, 1]),
       seed=st.integers(0, 2**31 - 1))
def test_kernel_equals_reference_bitwise(T, d, V, A, G, dtype, scale, padding, seed):
    padding = None if padding is not None and padding >= V else padding
    tables, idx, grad = _inputs(T, d, V, A, G, dtype, seed)
    out, grads = _run("cpu", tables, idx, grad, scale, padding)
    ref_out, ref_grads = _run("reference", tables, idx, grad, scale, padding)
    assert torch.equal(out, ref_out)
    for got, ref in zip(grads, ref_grads):
        assert torch.equal(got, ref)
    if padding is not None:
        assert not grads[0][padding].any()  # the padding row gets no gradient


def test_many_tokens_on_few_rows_sum_in_token_order():
    """5,000 tokens on 3 item rows: each row's gradient is a long sum, equal to torch's bitwise."""
    tables, _, grad = _inputs(5000, 32, 3, 4, 2, torch.float32, 0)
    g = torch.Generator().manual_seed(1)
    idx = [torch.randint(0, n, (5000,), generator=g) for n in (3, 4, 2)]
    _, grads = _run("cpu", tables, idx, grad, 16.0, 0)
    _, ref = _run("reference", tables, idx, grad, 16.0, 0)
    assert all(torch.equal(a, b) for a, b in zip(grads, ref))


def test_opcheck_and_errors():
    import grlib.ops.cpu.embedding  # noqa: F401  (the fake impls)

    tables, idx, grad = _inputs(9, 8, 5, 4, 3, torch.float32, 0)
    torch.library.opcheck(torch.ops.grlib.embedding_sum.default, (*[t.detach() for t in tables], *idx, 2.0))
    torch.library.opcheck(torch.ops.grlib.embedding_sum_backward.default, (grad, *idx, 5, 4, 3, 2.0, 0))
    items, actions, gaps = (t.detach() for t in tables)
    ids, acts, gap = idx
    with pytest.raises(RuntimeError, match=r"embedding_sum: ids\[2\] = 5 is out of range \[0, 5\)"):
        ops.embedding_sum(items, actions, gaps, torch.tensor([0, 1, 5, 0, 0, 0, 0, 0, 0]), acts, gap, 1.0,
                          impl="cpu")
    with pytest.raises(ValueError, match=r"embedding_sum: gaps must be \[rows, d=8\]"):
        ops.embedding_sum(items, actions, torch.randn(3, 7), ids, acts, gap, 1.0)
    with pytest.raises(ValueError, match=r"embedding_sum: acts must be integer \[T=9\]"):
        ops.embedding_sum(items, actions, gaps, ids, acts[:4], gap, 1.0)


def test_model_embeddings_use_the_op_and_match_the_torch_sum():
    """Embeddings.forward over the local item table and over item rows looked up ahead (the op with a
    table of T rows) give torch's sum bitwise, and the same table gradients."""
    from grlib.jagged import JaggedBatch
    from grlib.model.embeddings import ITEM_ROWS, N_GAP_BUCKETS, Embeddings, time_gaps
    from grlib.ops.attention import time_buckets

    torch.manual_seed(0)
    emb = Embeddings(50, 16)
    lengths = torch.tensor([0, 1, 5, 3])
    T = int(lengths.sum())
    batch = JaggedBatch(item_ids=torch.randint(1, 50, (T,)), actions=torch.randint(0, 256, (T,)),
                        timestamps=torch.cumsum(torch.randint(0, 10_000, (T,)), 0),
                        offsets=ops.offsets_from_lengths(lengths), max_len=8, targets=torch.zeros(T, dtype=torch.long))
    fused = emb(batch)
    fused.backward(torch.ones_like(fused))
    table_grads = [p.grad.clone() for p in (emb.items.weight, emb.actions.weight, emb.gaps.weight)]
    emb.zero_grad()
    batch.attachments[ITEM_ROWS] = emb.items(batch.item_ids)  # the rows path: a table of T rows
    ahead = emb(batch)
    assert torch.equal(fused, ahead)
    ahead.backward(torch.ones_like(ahead))
    assert all(torch.equal(p.grad, g) for p, g in
               zip((emb.items.weight, emb.actions.weight, emb.gaps.weight), table_grads))
    with torch.no_grad():
        reference = emb.items(batch.item_ids) * 4.0 + emb.actions(batch.actions) + emb.gaps(
            time_buckets(time_gaps(batch.timestamps, batch.offsets), N_GAP_BUCKETS))
    assert torch.equal(fused, reference)
