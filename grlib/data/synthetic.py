"""A synthetic KuaiRand-schema log with planted sequential structure (deterministic per seed).

Shape, calibrated to the published KuaiRand-27K figures (shared/data/real/README.md):
  - per-user lengths: lognormal fit to the interactions per user (median 8,646, p90 24,650,
    p99 56,244; clipped to min 110, max 228,030), multiplied by `length_factor`;
  - clicks 37.9% of the rows, long views 26.0% (more often on clicked rows), rarer actions on
    clicks; per-video durations with 8.5% of the rows at duration_ms <= 0 (27.3M of 322M);
  - Zipf item popularity (exponent ZIPF_EXPONENT over a random item order);
  - timestamps inside the 31 days of the logs (2022-04-08 .. 2022-05-08), `date` and `hourmin`
    in Beijing time with hour granularity, as in the real files.

Planted structure, so that a sequence model can beat a popularity ranking:
  - items fall into clusters laid out on a ring; a user stays in the current cluster, steps to a
    ring neighbour (-1, +1, +2), or jumps to one of three favourite clusters;
  - the favourites drift: one of the three is replaced at each of EPOCHS equal spans of a user's
    history;
  - inside a cluster the next video is, with probability P_NEXT, the successor of the previous one
    in the cluster's fixed order (an episode, a series), else a fresh Zipf-weighted draw.

Generation runs in chunks of CHUNK_USERS users with their own random streams (keyed by seed and
chunk index), so memory is bounded by one chunk and the log does not depend on how it is written
(`generate_log` in memory, `write_log_csv` streamed to a CSV file).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from grlib import schema
from grlib.io import atomic_write
from grlib.schema import LOG_COLUMNS

if TYPE_CHECKING:  # polars is imported where a log is made: the length model (LENGTH_*, user_lengths,
    # kuairand_lengths) imports without it (grlib.probes.device_check on a GPU machine without polars)
    import polars as pl

# Lognormal fit to the KuaiRand-27K interactions-per-user quantiles (median, p90, p99).
LENGTH_MEDIAN, LENGTH_MIN, LENGTH_MAX = 8646, 110, 228_030
LENGTH_SIGMA = 0.81  # (ln p90 - ln median) / 1.2816 = 0.817, (ln p99 - ln median) / 2.3263 = 0.805
Z99 = 2.3263478740408408  # standard normal 0.99 quantile
PUBLISHED_27K = {"users": 27_285, "length_p50": 8646, "length_p90": 24_650, "length_p99": 56_244,
                 "length_min": 110, "length_max": 228_030, "click_rate": 0.379, "long_view_rate": 0.260}
CLICK_RATE, LONG_VIEW_RATE = 0.379, 0.260
LONG_VIEW_IF_CLICK = 0.55  # P(long_view | click); P(long_view | no click) follows from the overall rate
ZERO_DURATION_RATE = 27_274_006 / 322_278_385  # rows with duration_ms <= 0 in the 27K standard logs
START_MS = 1_649_347_200_000  # 2022-04-08 00:00 Beijing time (UTC+8), first day of the logs
SPAN_MS = 31 * 86_400_000  # 2022-04-08 .. 2022-05-08
BEIJING_MS = 8 * 3_600_000

ITEMS_PER_CLUSTER = 40
ZIPF_EXPONENT = 1.0
P_SWITCH = 0.12  # leave the current cluster at an event
P_JUMP = 0.5  # a switch jumps to a favourite (else steps to a ring neighbour)
P_NEXT = 0.6  # inside a cluster: the successor of the previous video (else a fresh draw)
EPOCHS = 4  # favourite drift: one favourite replaced at each quarter of a user's history
CHUNK_USERS = 64
TABS = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
TAB_WEIGHTS = np.array([30, 35, 8, 4, 10, 3, 2, 1, 2, 1, 1, 1, 0.5, 0.5, 1.0])


def user_lengths(n_users: int, length_factor: float, rng: np.random.Generator, min_len: int = 5) -> np.ndarray:
    """[n_users] events per user: the 27K lognormal fit times length_factor (at least min_len)."""
    raw = rng.lognormal(math.log(LENGTH_MEDIAN), LENGTH_SIGMA, n_users).clip(LENGTH_MIN, LENGTH_MAX)
    return np.maximum(np.round(raw * length_factor), min_len).astype(np.int64)


def kuairand_lengths(n: int, max_len: int, regime: str, seed: int = 0) -> np.ndarray:
    """n per-user lengths from the lognormal fit to KuaiRand-27K's published quantiles.

    regime 'truncated': the real lengths cut at max_len (nearly all full when max_len <= 4096);
    regime 'scaled': the distribution scaled so that its p99 equals max_len (real raggedness,
    smaller size), cut at max_len."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(math.log(LENGTH_MEDIAN), LENGTH_SIGMA, n).clip(LENGTH_MIN, LENGTH_MAX)
    if regime == "scaled":
        p99 = LENGTH_MEDIAN * math.exp(LENGTH_SIGMA * Z99)
        raw = raw * (max_len / p99)
    elif regime != "truncated":
        raise ValueError(f"regime must be 'truncated' or 'scaled', got {regime!r}")
    return np.clip(np.round(raw), 1, max_len).astype(np.int64)


@dataclass(frozen=True)
class Catalogue:
    """Items, clusters and per-item attributes shared by every user of one seed."""

    n_clusters: int
    members: np.ndarray  # [n_items] video ids grouped by cluster, in each cluster's episode order
    cluster_start: np.ndarray  # [C+1] offsets of each cluster inside `members`
    cdf: np.ndarray  # [n_items] cluster c's popularity CDF shifted into [c, c+1)
    duration: np.ndarray  # [n_items] duration_ms per video id


def catalogue(n_items: int, rng: np.random.Generator) -> Catalogue:
    n_clusters = max(2, round(n_items / ITEMS_PER_CLUSTER))
    members = rng.permutation(n_items)
    sizes = np.diff(np.linspace(0, n_items, n_clusters + 1).round().astype(np.int64))
    cluster_start = np.concatenate([[0], np.cumsum(sizes)])
    weight = 1.0 / (1.0 + rng.permutation(n_items)) ** ZIPF_EXPONENT  # [n_items] by video id
    w = weight[members]
    cluster = np.repeat(np.arange(n_clusters), sizes)
    within = np.cumsum(w) - np.repeat(np.cumsum(w)[cluster_start[:-1]] - w[cluster_start[:-1]], sizes)
    cdf = cluster + within / np.repeat(within[cluster_start[1:] - 1], sizes)
    duration = np.round(rng.lognormal(math.log(25_866), 0.9, n_items)).astype(np.int64) + 1_000
    duration[rng.random(n_items) < ZERO_DURATION_RATE] = 0
    return Catalogue(n_clusters, members, cluster_start, cdf, duration)


def _last_true_index(flag: np.ndarray) -> np.ndarray:
    """[T] index of the latest position <= t where flag is set (flag[0] must be set)."""
    return np.maximum.accumulate(np.where(flag, np.arange(flag.size), 0))


def _chunk(cat: Catalogue, lengths: np.ndarray, first_user: int, rng: np.random.Generator) -> pl.DataFrame:
    """The log rows of users first_user .. first_user + len(lengths) - 1, sorted by user then time."""
    import polars as pl

    n, total, C = lengths.size, int(lengths.sum()), cat.n_clusters
    local = np.repeat(np.arange(n), lengths)  # [T] user index inside the chunk
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = np.arange(total) - start[local]  # [T] position inside the user's history
    first = pos == 0

    # Favourite clusters per epoch, one replaced at each epoch boundary (interest drift).
    favs = np.empty((n, EPOCHS, 3), dtype=np.int64)
    favs[:, 0] = rng.integers(0, C, (n, 3))
    for e in range(1, EPOCHS):
        favs[:, e] = favs[:, e - 1]
        favs[np.arange(n), e, rng.integers(0, 3, n)] = rng.integers(0, C, n)
    epoch = pos * EPOCHS // lengths[local]

    # Cluster walk: a jump resets the ring position, a neighbour step adds an offset.
    switch = first | (rng.random(total) < P_SWITCH)
    jump = switch & (first | (rng.random(total) < P_JUMP))
    step = np.where(switch & ~jump, rng.choice(np.array([-1, 1, 2]), total), 0)
    target = favs[local, epoch, rng.integers(0, 3, total)]
    steps = np.cumsum(step)
    last_jump = _last_true_index(jump)
    cluster = (target[last_jump] + steps - steps[last_jump]) % C

    # Videos: a fresh popularity-weighted draw, or the successor of the previous video.
    fresh = switch | (rng.random(total) >= P_NEXT)
    draw = np.searchsorted(cat.cdf, cluster + rng.random(total), side="right")
    last_fresh = _last_true_index(fresh)
    c0, size = cat.cluster_start[cluster], np.diff(cat.cluster_start)[cluster]
    slot = c0 + (draw[last_fresh] - c0 + np.arange(total) - last_fresh) % size
    video = cat.members[slot]

    # Timestamps: each user active over a random part of the 31 days, increasing in file order.
    span = (SPAN_MS - 3_600_000) * rng.uniform(0.5, 1.0, n)
    offset = rng.uniform(0, SPAN_MS - span - 3_600_000)  # an hour of margin for the +pos below
    gap = rng.exponential(1.0, total)  # [T] relative waiting times, scaled to the user's span
    within = np.cumsum(gap)
    within -= (within[start] - gap[start])[local]
    frac = within / within[start + lengths - 1][local]  # (0, 1], increasing per user
    time_ms = (START_MS + (offset[local] + span[local] * frac).astype(np.int64)) + pos  # +pos: strictly increasing

    click = rng.random(total) < CLICK_RATE
    lv_other = (LONG_VIEW_RATE - CLICK_RATE * LONG_VIEW_IF_CLICK) / (1 - CLICK_RATE)
    long_view = rng.random(total) < np.where(click, LONG_VIEW_IF_CLICK, lv_other)
    duration = cat.duration[video]
    full = np.maximum(np.minimum(duration, 18_000), 1)
    play = np.where(long_view, full + rng.integers(0, 30_000, total), (full * rng.random(total)).astype(np.int64))
    profile = click & (rng.random(total) < 0.02)
    local_ms = time_ms + BEIJING_MS
    days = local_ms // 86_400_000 - (START_MS + BEIJING_MS) // 86_400_000  # days since 2022-04-08 (local)
    return pl.DataFrame({
        "user_id": local.astype(np.int64) + first_user,
        "video_id": video.astype(np.int64),
        "date": np.asarray(20220408 + days + np.where(days >= 23, 100 - 30, 0), dtype=np.int64),
        "hourmin": (local_ms // 3_600_000 % 24) * 100,
        "time_ms": time_ms,
        "is_click": click,
        "is_like": click & (rng.random(total) < 0.04),
        "is_follow": click & (rng.random(total) < 0.005),
        "is_comment": click & (rng.random(total) < 0.01),
        "is_forward": click & (rng.random(total) < 0.004),
        "is_hate": rng.random(total) < 0.002,
        "long_view": long_view,
        "play_time_ms": play,
        "duration_ms": duration,
        "profile_stay_time": np.where(profile, rng.integers(1_000, 60_000, total), 0),
        "comment_stay_time": np.where(click & (rng.random(total) < 0.03), rng.integers(1_000, 90_000, total), 0),
        "is_profile_enter": profile,
        "is_rand": np.zeros(total, dtype=np.int64),
        "tab": rng.choice(TABS, total, p=TAB_WEIGHTS / TAB_WEIGHTS.sum()),
    }).cast(schema.LOG_SCHEMA)


def iter_log_chunks(n_users: int, length_factor: float, n_items: int, seed: int = 0) -> Iterator[pl.DataFrame]:
    """The log of `generate_log` as frames of CHUNK_USERS users each (bounded memory)."""
    lengths = user_lengths(n_users, length_factor, np.random.default_rng([seed, 0]))
    cat = catalogue(n_items, np.random.default_rng([seed, 1]))
    for i, a in enumerate(range(0, n_users, CHUNK_USERS)):
        rng = np.random.default_rng([seed, 2, i])
        yield _chunk(cat, lengths[a:a + CHUNK_USERS], a, rng)


def generate_log(n_users: int, length_factor: float, n_items: int, seed: int = 0) -> pl.DataFrame:
    """A 19-column log with `sum(user_lengths)` rows, sorted by user then time."""
    import polars as pl

    return pl.concat(list(iter_log_chunks(n_users, length_factor, n_items, seed)))


def expected_rows(n_users: int, length_factor: float, seed: int = 0) -> int:
    """Rows `generate_log` will produce (the lengths are drawn first, from their own stream)."""
    return int(user_lengths(n_users, length_factor, np.random.default_rng([seed, 0])).sum())


def write_log_csv(path: Path, n_users: int, length_factor: float, n_items: int, seed: int = 0) -> int:
    """Streams the log to a KuaiRand-style CSV (header + rows), atomically; returns the row count."""
    rows = 0

    def write(tmp: Path) -> None:
        nonlocal rows
        with open(tmp, "wb") as fh:
            for i, chunk in enumerate(iter_log_chunks(n_users, length_factor, n_items, seed)):
                chunk.select(LOG_COLUMNS).write_csv(fh, include_header=i == 0)
                rows += chunk.height

    atomic_write(path, write)
    return rows
