"""Preprocessing semantics (leave-one-out on targets, vocabulary, bitmask) and jagged batches."""
from __future__ import annotations

import numpy as np
import polars as pl
import torch

from grlib.schema import FIRST_ITEM_ID, LOG_COLUMNS, LOG_SCHEMA, OOV_ID
from grlib.data.sequences import SequenceData, build_sequences, ranges_to_index
from grlib.data.synthetic import generate_log


def _log(rows):
    base = {c: 0 for c in LOG_COLUMNS}
    return pl.DataFrame([{**base, **r} for r in rows]).cast(LOG_SCHEMA)


def test_leave_one_out_on_targets_and_bitmask():
    # user 7: events at t=1..6 (given out of order); clicks at t=2, 4, 5 -> val t=4, test t=5
    rows = [{"user_id": 7, "video_id": v, "time_ms": t * 1000, "is_click": c, "long_view": lv}
            for v, t, c, lv in [(30, 5, 1, 0), (10, 1, 0, 1), (20, 2, 1, 0), (10, 3, 0, 0), (40, 4, 1, 0), (50, 6, 0, 0)]]
    rows.append({"user_id": 8, "video_id": 10, "time_ms": 1, "is_click": 1})  # 1 target: dropped
    seqs, vocab = build_sequences(_log(rows), max_len=10)
    assert seqs["user_id"].to_list() == [7]
    row = seqs.row(0, named=True)
    ids = dict(zip(vocab["video_id"], vocab["item_id"]))
    assert row["item_ids"] == [ids[v] for v in (10, 20, 10, 40, 30)]  # t=6, after the test target: cut
    assert ids[10] == FIRST_ITEM_ID  # the most frequent video gets the first id
    assert row["timestamps"] == [1, 2, 3, 4, 5]
    assert row["actions"] == [64, 1, 0, 1, 1]
    assert row["n_events"] == 6
    assert (row["val_pos"], row["test_pos"]) == (3, 4)


def test_truncation_keeps_max_len_before_validation_and_oov():
    rows = [{"user_id": 1, "video_id": 100 + t, "time_ms": t, "is_click": 1} for t in range(20)]
    rows += [{"user_id": 2, "video_id": 100, "time_ms": t, "is_click": 1} for t in range(3)]
    seqs, vocab = build_sequences(_log(rows), max_len=5, min_item_count=2)
    user1 = seqs.filter(pl.col("user_id") == 1).row(0, named=True)
    assert user1["val_pos"] == 5 and user1["test_pos"] == 6  # 5 context events before val
    assert len(user1["item_ids"]) == 7
    assert set(user1["item_ids"]) == {OOV_ID}  # videos seen once fall below min_item_count
    assert vocab["video_id"].to_list() == [100]


def test_ranges_to_index():
    assert ranges_to_index(np.array([3, 0, 7]), np.array([5, 0, 8])).tolist() == [3, 4, 7]


def test_batches_targets_and_eval_context():
    seqs, vocab = build_sequences(generate_log(40, 0.005, 100, seed=1), max_len=8)
    data = SequenceData(seqs, vocab.height + FIRST_ITEM_ID)
    batch = next(data.train_batches(5, 8, np.random.default_rng(0)))
    lengths = (batch.offsets[1:] - batch.offsets[:-1])
    assert int(lengths.max()) <= 8 and batch.targets.shape == batch.item_ids.shape
    last = batch.offsets[1:] - 1
    assert (batch.targets[last] == 0).all()  # the last token's next event is outside the window
    ev = next(data.eval_batches("test", 6, 8))
    for b in range(ev.batch_size):
        pos = data.test_pos[b]
        ctx = batch_slice(ev, b)
        start = data.user_offsets[b]
        assert ctx.tolist() == data.items[start + max(0, pos - 8): start + pos].tolist()
        assert int(ev.eval_targets[b]) == data.items[start + pos]
        assert len(ev.history[b]) == pos


def batch_slice(batch, b):
    return batch.item_ids[batch.offsets[b]:batch.offsets[b + 1]]


def test_synthetic_log_is_deterministic_and_has_the_schema():
    a, b = generate_log(20, 0.003, 50, seed=4), generate_log(20, 0.003, 50, seed=4)
    assert a.columns == list(LOG_COLUMNS) and a.equals(b)
    assert not a.equals(generate_log(20, 0.003, 50, seed=5))
    assert torch.tensor(a["is_click"].to_numpy()).float().mean().item() > 0.2
