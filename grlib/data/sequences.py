"""Raw log rows -> per-user sequences with leave-one-out splits, and their jagged batches
(grlib.jagged.JaggedBatch).

Sequences table (one row per user, parquet):
    user_id       int64
    item_ids      list[int32]   dense vocabulary ids (0 pad, 1 out-of-vocabulary, 2.. by frequency)
    actions       list[int16]   action bitmask (grlib.schema.ACTION_BITS)
    timestamps    list[int64]   seconds (time_ms // 1000)
    play_time_ms  list[int32]   the user's view time of each event
    duration_ms   list[int32]   the video's duration (<= 0 where the log has none)
    is_target     list[bool]    events the model is asked to predict (default: clicks)
    val_pos       int32         index of the validation target (second-last target)
    test_pos      int32         index of the test target (last target)
    n_events      int32         the user's events after the event filter, before the cut to max_len

Vocabulary table (vocab.parquet): video_id int64, count uint32 (rows of the log), item_id int32;
most frequent first, ties by video_id; videos seen fewer than min_item_count times are left out
and map to OOV_ID.

Event filter: `target` names the log column whose rows are targets (is_click by default, any
action of ACTION_BITS, or "all"); `context` = "all" keeps every impression as context (the
default: the model sees what the user scrolled past, as in KuaiRand's sequential logs), "targets"
keeps only the target events. Events of one user are ordered by time_ms, ties by file order.

Only targets are predicted. Training uses events before val_pos; validation predicts
events[val_pos] from the max_len events before it; test predicts events[test_pos] likewise.
Users with fewer than 3 targets are dropped. Each sequence is cut so that it starts at most
max_len events before val_pos and ends at test_pos (older and later events are never used).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from grlib.schema import ACTION_BITS, FIRST_ITEM_ID, OOV_ID, action_mask_expr

if TYPE_CHECKING:
    from grlib.jagged import JaggedBatch

# torch (about 220 MB resident) is imported where a batch is built, not with the module: `data prepare`
# reads raw logs through this module without loading it (its peak memory on a hostile file is checked
# by tests/test_trust_inputs.py)


def __getattr__(name: str) -> Any:
    if name == "JaggedBatch":  # the batch type, re-exported: grlib.data.sequences.JaggedBatch
        from grlib.jagged import JaggedBatch
        return JaggedBatch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

TARGETS = ("all", *ACTION_BITS)
CONTEXTS = ("all", "targets")
LIST_COLUMNS = ("item_ids", "actions", "timestamps", "play_time_ms", "duration_ms", "is_target")


def target_expr(target: str) -> pl.Expr:
    """Boolean expression marking target rows of a raw log."""
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not one of {TARGETS}")
    return (pl.lit(True) if target == "all" else pl.col(target) > 0).alias("is_target")


def vocab_from_counts(counts: pl.DataFrame, min_item_count: int) -> pl.DataFrame:
    """(video_id, count) -> vocabulary, most frequent first, items below min_item_count left out."""
    vocab = (counts.filter(pl.col("count") >= min_item_count)
             .sort(["count", "video_id"], descending=[True, False]))
    return vocab.select(pl.col("video_id").cast(pl.Int64), pl.col("count").cast(pl.UInt32),
                        (pl.int_range(pl.len(), dtype=pl.Int32) + FIRST_ITEM_ID).alias("item_id"))


def build_vocab(log: pl.LazyFrame, min_item_count: int) -> pl.DataFrame:
    """video_id -> item_id, most frequent first, items below min_item_count left out (-> OOV)."""
    counts = log.group_by("video_id").agg(pl.len().alias("count")).collect()
    return vocab_from_counts(counts, min_item_count)


def event_columns(target: str) -> list[pl.Expr]:
    """Raw log columns -> the per-event columns of the sequences table (before the vocabulary)."""
    return [pl.col("user_id"), pl.col("video_id"), pl.col("time_ms"), action_mask_expr().alias("actions"),
            pl.col("play_time_ms"), pl.col("duration_ms"), target_expr(target)]


def group_sequences(events: pl.LazyFrame, max_len: int, context: str = "all") -> pl.LazyFrame:
    """Events (user_id, item_ids, time_ms, actions, play_time_ms, duration_ms, is_target), already
    sorted by user then time -> one row per user with leave-one-out positions, cut to max_len."""
    if context not in CONTEXTS:
        raise ValueError(f"context {context!r} is not one of {CONTEXTS}")
    if context == "targets":
        events = events.filter(pl.col("is_target"))
    seqs = events.group_by("user_id", maintain_order=True).agg(
        pl.col("item_ids").cast(pl.Int32),
        pl.col("actions").cast(pl.Int16),
        (pl.col("time_ms") // 1000).alias("timestamps"),
        pl.col("play_time_ms").cast(pl.Int32),
        pl.col("duration_ms").cast(pl.Int32),
        pl.col("is_target"),
    )
    target_idx = pl.col("is_target").list.eval(pl.arg_where(pl.element()))
    seqs = (seqs.with_columns(target_idx.alias("_t"), pl.col("item_ids").list.len().cast(pl.Int32).alias("n_events"))
            .filter(pl.col("_t").list.len() >= 3)
            .with_columns(pl.col("_t").list.get(-1).cast(pl.Int64).alias("test_pos"),
                          pl.col("_t").list.get(-2).cast(pl.Int64).alias("val_pos"))
            .with_columns((pl.col("val_pos") - max_len).clip(lower_bound=0).alias("_start")))
    return seqs.with_columns(
        *[pl.col(c).list.slice(pl.col("_start"), pl.col("test_pos") - pl.col("_start") + 1) for c in LIST_COLUMNS],
        (pl.col("val_pos") - pl.col("_start")).cast(pl.Int32).alias("val_pos"),
        (pl.col("test_pos") - pl.col("_start")).cast(pl.Int32).alias("test_pos"),
    ).select("user_id", *LIST_COLUMNS, "val_pos", "test_pos", "n_events")


def build_sequences(log: pl.LazyFrame | pl.DataFrame, max_len: int, min_item_count: int = 1,
                    target: str = "is_click", context: str = "all") -> tuple[pl.DataFrame, pl.DataFrame]:
    """Returns (sequences, vocab) of an in-memory log (grlib.data.preprocess streams big files
    through the same group_sequences)."""
    log = log.lazy()
    vocab = build_vocab(log, min_item_count)
    events = (
        log.select(event_columns(target))
        .join(vocab.lazy().select("video_id", "item_id"), on="video_id", how="left", maintain_order="left")
        .with_columns(pl.col("item_id").fill_null(OOV_ID).alias("item_ids"))
        .sort(["user_id", "time_ms"], maintain_order=True)
    )
    return group_sequences(events, max_len, context).collect(), vocab


def ranges_to_index(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, e) for each (s, e), without a Python loop."""
    lengths = ends - starts
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return np.arange(offsets[-1]) - np.repeat(offsets[:-1] - starts, lengths)


class SequenceData:
    """A sequences table held as flat numpy arrays (values + per-user offsets).

    Token arrays (items, actions, timestamps, is_target: [N] over every user's events back to back)
    are only read through `_tokens(name, starts, ends)`, the concatenated ranges [starts, ends);
    grlib.data.share.MappedSequences overrides it to read them from flat files, so that a rank holds
    the per-user arrays (user_offsets [U+1], val_pos [U], test_pos [U]) and the batch it reads."""

    TOKEN_ARRAYS = ("items", "actions", "timestamps", "is_target")

    def __init__(self, seqs: pl.DataFrame, n_items: int):
        self.n_users = seqs.height
        self.n_items = n_items  # vocabulary size including pad and OOV ids
        lengths = seqs["item_ids"].list.len().to_numpy().astype(np.int64)
        self.user_offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.items = seqs["item_ids"].explode().to_numpy().astype(np.int64)
        self.actions = seqs["actions"].explode().to_numpy().astype(np.int64)
        self.timestamps = seqs["timestamps"].explode().to_numpy().astype(np.int64)
        self.is_target = seqs["is_target"].explode().to_numpy().astype(bool)
        self.val_pos = seqs["val_pos"].to_numpy().astype(np.int64)
        self.test_pos = seqs["test_pos"].to_numpy().astype(np.int64)

    @classmethod
    def load(cls, folder: Path) -> "SequenceData":
        seqs = pl.read_parquet(folder / "sequences.parquet", columns=[
            "user_id", "item_ids", "actions", "timestamps", "is_target", "val_pos", "test_pos"])
        vocab = pl.read_parquet(folder / "vocab.parquet")
        return cls(seqs, n_items=vocab.height + FIRST_ITEM_ID)

    def _tokens(self, name: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Token array `name` (TOKEN_ARRAYS) over the ranges [starts, ends) back to back, as int64
        (bool for is_target); a new array, never a view of the data."""
        return getattr(self, name)[ranges_to_index(starts, ends)]

    def train_item_counts(self, chunk_events: int = 1 << 20) -> np.ndarray:
        """[n_items] target counts in the training part (for the popularity baseline), read in
        chunks of consecutive users of about chunk_events events."""
        counts = np.zeros(self.n_items, dtype=np.int64)
        u = 0
        while u < self.n_users:
            stop = max(u + 1, int(np.searchsorted(self.user_offsets, self.user_offsets[u] + chunk_events, "right")) - 1)
            stop = min(stop, self.n_users)
            users = np.arange(u, stop)
            base = self.user_offsets[users]
            items = self._tokens("items", base, base + self.val_pos[users])
            target = self._tokens("is_target", base, base + self.val_pos[users])
            counts += np.bincount(items[target], minlength=self.n_items)
            u = stop
        return counts

    def _windows(self, users: np.ndarray, ends: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(absolute starts [B], absolute ends [B], offsets [B+1]) of the users' windows of at most
        max_len events before `ends` (positions inside each user's sequence)."""
        base = self.user_offsets[users]
        starts = np.maximum(0, ends - max_len)
        offsets = np.concatenate([[0], np.cumsum(ends - starts)]).astype(np.int64)
        return base + starts, base + ends, offsets

    def _targets(self, a: np.ndarray, b: np.ndarray, offsets: np.ndarray, items: np.ndarray) -> np.ndarray:
        """[T] targets of the windows [a, b) whose items are `items`: token i predicts event i+1
        when that event is a target inside the window (0 elsewhere)."""
        lengths = b - a
        nonlast = np.ones(items.size, dtype=bool)  # [T] tokens whose next event is inside the window
        nonlast[offsets[1:][lengths > 0] - 1] = False
        nxt_start = a + (lengths > 0)  # the next events of the non-last tokens: [a + 1, b)
        hit = self._tokens("is_target", nxt_start, np.maximum(nxt_start, b))  # [T - #nonempty]
        targets = np.zeros(items.size, dtype=np.int64)
        at = np.flatnonzero(nonlast)  # [T - #nonempty], aligned with hit
        targets[at[hit]] = items[at[hit] + 1]
        return targets

    def _batch(self, users: np.ndarray, ends: np.ndarray, max_len: int, with_targets: bool) -> JaggedBatch:
        import torch

        from grlib.jagged import JaggedBatch

        a, b, offsets = self._windows(users, ends, max_len)
        items = self._tokens("items", a, b)
        targets = self._targets(a, b, offsets, items) if with_targets else np.zeros(items.size, dtype=np.int64)
        return JaggedBatch(
            item_ids=torch.from_numpy(items),
            actions=torch.from_numpy(self._tokens("actions", a, b)),
            timestamps=torch.from_numpy(self._tokens("timestamps", a, b)),
            offsets=torch.from_numpy(offsets),
            max_len=max_len,
            targets=torch.from_numpy(targets),
        )

    def train_order(self, batch_size: int, rng: np.random.Generator):
        """The users of each training batch of one epoch ([B] each), shuffled by rng."""
        order = rng.permutation(self.n_users)
        for i in range(0, self.n_users, batch_size):
            yield order[i:i + batch_size]

    def train_batches(self, batch_size: int, max_len: int, rng: np.random.Generator):
        """Shuffled training batches: each user's events before val_pos (last max_len of them)."""
        for users in self.train_order(batch_size, rng):
            yield self._batch(users, self.val_pos[users], max_len, with_targets=True)

    def n_train_batches(self, batch_size: int) -> int:
        return -(-self.n_users // batch_size)

    def eval_batches(self, split: str, batch_size: int, max_len: int):
        """Batches for 'val' or 'test': context = max_len events before the target."""
        if split not in ("val", "test"):
            raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        import torch

        pos = self.val_pos if split == "val" else self.test_pos
        for i in range(0, self.n_users, batch_size):
            users = np.arange(i, min(i + batch_size, self.n_users))
            batch = self._batch(users, pos[users], max_len, with_targets=False)
            base = self.user_offsets[users]
            prefix = self._tokens("items", base, base + pos[users] + 1)  # each user's history and target
            ends = np.cumsum(pos[users] + 1)
            batch.eval_targets = torch.from_numpy(prefix[ends - 1])
            batch.history = np.split(prefix, ends)[:-1]
            batch.history = [h[:-1] for h in batch.history]
            yield batch
