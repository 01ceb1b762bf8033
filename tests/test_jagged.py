"""grlib.jagged.JaggedBatch: select / split / cat against a per-sequence model of the batch
(hypothesis, ragged batches incl. empty and length-1 sequences), to, nbytes, attachments."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.jagged import TOKEN_FIELDS, JaggedBatch


def make_batch(lengths: list[int], seed: int = 0, evaluation: bool = False) -> JaggedBatch:
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    rand = lambda: torch.randint(0, 1000, (T,), generator=g)  # noqa: E731
    batch = JaggedBatch(item_ids=rand(), actions=rand(), timestamps=rand(),
                        offsets=torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64),
                        max_len=max(lengths, default=0), targets=rand())
    if evaluation:
        batch.eval_targets = torch.randint(0, 1000, (len(lengths),), generator=g)
        batch.history = [np.arange(n + b, dtype=np.int64) for b, n in enumerate(lengths)]
    return batch


def sequences(batch: JaggedBatch) -> list[dict]:
    """The batch as a list of sequences (every per-token field, eval target and history)."""
    out = []
    for b in range(batch.batch_size):
        s, e = int(batch.offsets[b]), int(batch.offsets[b + 1])
        seq = {f: getattr(batch, f)[s:e].tolist() for f in TOKEN_FIELDS}
        if batch.eval_targets is not None:
            seq["eval_target"] = int(batch.eval_targets[b])
            seq["history"] = batch.history[b].tolist()
        out.append(seq)
    return out


def check_layout(batch: JaggedBatch) -> None:
    assert batch.offsets.dtype == torch.int64 and int(batch.offsets[0]) == 0
    assert int(batch.offsets[-1]) == batch.num_tokens
    assert (batch.lengths() >= 0).all()
    assert all(getattr(batch, f).numel() == batch.num_tokens for f in TOKEN_FIELDS)


lengths_st = st.lists(st.sampled_from([0, 1, 1, 2, 3, 7]), min_size=0, max_size=9)


@settings(max_examples=80)
@given(lengths_st, st.data(), st.booleans())
def test_select_takes_the_chosen_sequences_in_order(lengths, data, evaluation):
    batch = make_batch(lengths, seed=len(lengths), evaluation=evaluation)
    rows = data.draw(st.lists(st.integers(0, max(0, len(lengths) - 1)), max_size=12)) if lengths else []
    sub = batch.select(rows)
    check_layout(sub)
    assert sub.batch_size == len(rows) and sub.max_len == batch.max_len
    seqs = sequences(batch)
    assert sequences(sub) == [seqs[r] for r in rows]
    assert sub.lengths().tolist() == [lengths[r] for r in rows]


@settings(max_examples=80)
@given(lengths_st, st.integers(1, 12), st.booleans())
def test_split_then_cat_gives_the_batch(lengths, parts, evaluation):
    batch = make_batch(lengths, seed=parts, evaluation=evaluation)
    pieces = batch.split(parts)
    assert len(pieces) == parts
    sizes = [p.batch_size for p in pieces]
    assert sum(sizes) == len(lengths) and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    for p in pieces:
        check_layout(p)
    assert [s for p in pieces for s in sequences(p)] == sequences(batch)
    again = JaggedBatch.cat(pieces)
    check_layout(again)
    assert torch.equal(again.offsets, batch.offsets) and again.max_len == batch.max_len
    assert sequences(again) == sequences(batch)
    assert all(torch.equal(getattr(again, f), getattr(batch, f)) for f in TOKEN_FIELDS)


def test_split_pieces_are_views_and_rows_checks_its_bounds():
    batch = make_batch([2, 0, 1, 3])
    first, second = batch.split(2)
    assert first.item_ids.data_ptr() == batch.item_ids.data_ptr()  # no copy of the tokens
    assert second.offsets.tolist() == [0, 1, 4] and first.offsets.tolist() == [0, 2, 2]
    with pytest.raises(IndexError, match="rows 3:5"):
        batch.rows(3, 5)
    with pytest.raises(ValueError, match="parts"):
        batch.split(0)


def test_cat_refuses_mixed_batches():
    with pytest.raises(ValueError, match="eval_targets"):
        JaggedBatch.cat([make_batch([1], evaluation=True), make_batch([2])])
    with pytest.raises(ValueError, match="at least one"):
        JaggedBatch.cat([])


def test_nbytes_to_and_attachments():
    batch = make_batch([3, 0, 1], evaluation=True)
    T, B = 4, 3
    history = sum(h.nbytes for h in batch.history)
    assert batch.nbytes() == (4 * T + (B + 1) + B) * 8 + history
    batch.attachments["sample"] = torch.arange(5)
    batch.attachments["note"] = "kept as is"
    moved = batch.to("meta")
    assert all(getattr(moved, f).device.type == "meta" for f in (*TOKEN_FIELDS, "offsets", "eval_targets"))
    assert moved.attachments["sample"].device.type == "meta" and moved.attachments["note"] == "kept as is"
    assert moved.history is batch.history
    # attachments describe the batch's own tokens: sub-batches and concatenations start without them
    assert not batch.select([0]).attachments and not batch.split(2)[0].attachments
    assert not JaggedBatch.cat([batch]).attachments
    assert batch.attachments["note"] == "kept as is"  # (and the batch keeps its own)
