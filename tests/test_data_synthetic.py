"""The synthetic KuaiRand twin: calibrated to the published 27K figures, deterministic per seed,
chunk-independent, and with sequential structure that a first-order Markov model can exploit
(and that disappears when each user's videos are shuffled)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from grlib.data.preprocess import read_log
from grlib.schema import FIRST_ITEM_ID, LOG_COLUMNS, LOG_SCHEMA
from grlib.data.sequences import SequenceData, build_sequences, ranges_to_index
from grlib.data.synthetic import (CHUNK_USERS, CLICK_RATE, LONG_VIEW_RATE, PUBLISHED_27K, generate_log,
                                  iter_log_chunks, user_lengths, write_log_csv)
from grlib.evaluate import evaluate, popularity_scores


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lengths_match_the_published_27k_quantiles_within_10_percent(seed):
    lengths = user_lengths(PUBLISHED_27K["users"], 1.0, np.random.default_rng([seed, 0]))
    for key, q in (("length_p50", 0.5), ("length_p90", 0.9), ("length_p99", 0.99)):
        assert abs(np.quantile(lengths, q) / PUBLISHED_27K[key] - 1) < 0.10, key
    assert lengths.min() >= PUBLISHED_27K["length_min"] and lengths.max() <= PUBLISHED_27K["length_max"]


def test_lengths_scale_with_the_length_factor():
    full = user_lengths(5000, 1.0, np.random.default_rng([0, 0]))
    small = user_lengths(5000, 0.01, np.random.default_rng([0, 0]))
    assert abs(np.median(small) / (np.median(full) * 0.01) - 1) < 0.02


def test_deterministic_chunk_independent_and_csv_round_trip(tmp_path):
    a = generate_log(2 * CHUNK_USERS + 5, 0.003, 80, seed=4)  # three chunks
    assert a.columns == list(LOG_COLUMNS) and dict(a.schema) == LOG_SCHEMA
    assert a.equals(generate_log(2 * CHUNK_USERS + 5, 0.003, 80, seed=4))
    assert not a.equals(generate_log(2 * CHUNK_USERS + 5, 0.003, 80, seed=5))
    assert len(list(iter_log_chunks(2 * CHUNK_USERS + 5, 0.003, 80, seed=4))) == 3
    rows = write_log_csv(tmp_path / "log.csv", 2 * CHUNK_USERS + 5, 0.003, 80, seed=4)
    assert rows == a.height and read_log(tmp_path / "log.csv").equals(a)
    # the first users do not depend on how many users follow
    head = generate_log(CHUNK_USERS, 0.003, 80, seed=4)
    assert a.filter(pl.col("user_id") < CHUNK_USERS).equals(head)


def test_the_csv_is_written_atomically_with_the_umask_mode(tmp_path, monkeypatch):
    import os
    import stat

    import grlib.data.synthetic as synthetic

    old = os.umask(0o027)
    try:
        write_log_csv(tmp_path / "log.csv", 3, 0.003, 80)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "log.csv").stat().st_mode) == 0o640  # grlib.io's mode (mkstemp's: 0o600)
    before = (tmp_path / "log.csv").read_bytes()
    chunk = generate_log(3, 0.003, 80)

    def broken(*args, **kwargs):  # one chunk written, then the generation fails
        yield chunk
        raise RuntimeError("disk full")

    monkeypatch.setattr(synthetic, "iter_log_chunks", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_log_csv(tmp_path / "log.csv", 30, 0.003, 80)
    assert (tmp_path / "log.csv").read_bytes() == before and os.listdir(tmp_path) == ["log.csv"]


def test_rates_ranges_and_order():
    log = generate_log(300, 0.02, 2000, seed=1)  # ~60K rows
    rate = lambda col: log[col].cast(pl.Float64).mean()  # noqa: E731
    assert abs(rate("is_click") - CLICK_RATE) < 0.01 and abs(rate("long_view") - LONG_VIEW_RATE) < 0.01
    assert 0.05 < (log["duration_ms"] <= 0).mean() < 0.12
    assert log["date"].min() >= 20220408 and log["date"].max() <= 20220508
    assert set(log["hourmin"].unique()) <= {h * 100 for h in range(24)}
    assert log.select((pl.col("time_ms").diff().over("user_id") > 0).all()).item()  # strictly increasing
    likes = log.filter(pl.col("is_like") == 1)
    assert likes["is_click"].min() == 1  # finer actions only on clicked rows
    counts = log.group_by("video_id").len().sort("len", descending=True)["len"].to_numpy()
    assert counts[: len(counts) // 100].sum() > 5 * counts[-len(counts) // 100:].sum()  # skewed popularity


def _markov_scores(data: SequenceData):
    """A first-order Markov model fit on the training part: score = transitions from the last item."""
    trans = np.zeros((data.n_items, data.n_items))
    idx = ranges_to_index(data.user_offsets[:-1], data.user_offsets[:-1] + data.val_pos)
    nxt = idx + 1
    inside = np.isin(nxt, idx)
    np.add.at(trans, (data.items[idx[inside]], data.items[nxt[inside]]), 1)
    pop = data.train_item_counts().astype(float)
    table = torch.as_tensor(trans + 1e-3 * pop / pop.max(), dtype=torch.float32)  # popularity breaks ties
    return lambda batch: table[batch.item_ids[batch.offsets[1:] - 1]]


def _markov_vs_popularity(log: pl.DataFrame, max_len: int = 50) -> float:
    seqs, vocab = build_sequences(log, max_len)
    data = SequenceData(seqs, vocab.height + FIRST_ITEM_ID)
    # repeat consumption: masking the history would reveal repeated targets (grlib.evaluate)
    markov = evaluate(_markov_scores(data), data.eval_batches("test", 256, max_len), mask_history=False)["ndcg@10"]
    pop = evaluate(popularity_scores(data.train_item_counts()), data.eval_batches("test", 256, max_len),
                   mask_history=False)["ndcg@10"]
    return markov / pop


def test_planted_sequence_structure_beats_popularity_and_shuffling_removes_it():
    log = generate_log(200, 0.01, 400, seed=0)
    assert _markov_vs_popularity(log) > 3.0
    shuffled = log.with_columns(pl.col("video_id").shuffle(seed=1).over("user_id"))
    assert _markov_vs_popularity(shuffled) < 1.5
