"""A synthetic KuaiRand-schema log with planted sequential structure (deterministic per seed).

Per-user lengths follow a lognormal fit to the published KuaiRand-27K interactions per user
(median 8,646, p90 24,650, p99 56,244; min 110, max 228,030), multiplied by `length_factor`.
Items belong to clusters; a user's next cluster follows a sparse Markov chain (stay, move to a
neighbour, or jump to one of the user's favourite clusters) and items inside a cluster are
Zipf-popular, so a sequence model can beat a popularity ranking. Clicks (37.9%) and long views
(26%) follow the published rates.
"""
from __future__ import annotations

import math

import numpy as np
import polars as pl

from grlib.data.schema import LOG_SCHEMA

# Lognormal fit to the KuaiRand-27K interactions-per-user quantiles (median, p90, p99).
LENGTH_MEDIAN, LENGTH_MIN, LENGTH_MAX = 8646, 110, 228_030
LENGTH_SIGMA = 0.81  # (ln p90 - ln median) / 1.2816 = 0.817, (ln p99 - ln median) / 2.3263 = 0.805
CLICK_RATE, LONG_VIEW_RATE = 0.379, 0.260
START_MS = 1_649_376_000_000  # 2022-04-08 00:00 UTC, first day of the KuaiRand logs


def user_lengths(n_users: int, length_factor: float, rng: np.random.Generator, min_len: int = 5) -> np.ndarray:
    raw = rng.lognormal(math.log(LENGTH_MEDIAN), LENGTH_SIGMA, n_users).clip(LENGTH_MIN, LENGTH_MAX)
    return np.maximum(np.round(raw * length_factor), min_len).astype(np.int64)


def generate_log(n_users: int, length_factor: float, n_items: int, seed: int = 0) -> pl.DataFrame:
    """A 19-column log with `sum(lengths)` rows, sorted by user then time."""
    rng = np.random.default_rng(seed)
    lengths = user_lengths(n_users, length_factor, rng)
    total = int(lengths.sum())
    n_clusters = max(4, n_items // 50)
    cluster_of = rng.integers(0, n_clusters, n_items)
    members = [np.flatnonzero(cluster_of == c) for c in range(n_clusters)]
    members = [m if m.size else np.array([c % n_items]) for c, m in enumerate(members)]

    user = np.repeat(np.arange(n_users, dtype=np.int64), lengths)
    start = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    pos = np.arange(total) - np.repeat(start, lengths)
    favourites = rng.integers(0, n_clusters, (n_users, 3))

    # Markov chain over clusters, advanced for all users at once, position by position.
    cluster = np.empty(total, dtype=np.int64)
    current = favourites[:, 0].copy()
    order = np.argsort(pos, kind="stable")  # rows grouped by position
    bounds = np.searchsorted(pos[order], np.arange(lengths.max() + 1))
    for p in range(int(lengths.max())):
        rows = order[bounds[p]:bounds[p + 1]]
        users = user[rows]
        u = rng.random(rows.size)
        cur = current[users]
        nxt = np.where(u < 0.55, cur, (cur + 1) % n_clusters)  # stay / next neighbour
        jump = u >= 0.85
        nxt[jump] = favourites[users[jump], rng.integers(0, 3, int(jump.sum()))]
        current[users] = nxt
        cluster[rows] = nxt

    # Zipf popularity inside each cluster.
    video = np.empty(total, dtype=np.int64)
    for c in range(n_clusters):
        rows = np.flatnonzero(cluster == c)
        m = members[c]
        ranks = np.minimum(rng.zipf(1.3, rows.size) - 1, m.size - 1)
        video[rows] = m[ranks]

    gaps = rng.exponential(60_000.0, total).astype(np.int64) + 1_000
    gaps[start] = rng.integers(0, 14 * 86_400_000, n_users)
    time_ms = START_MS + np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[start] - gaps[start], lengths)
    click = rng.random(total) < CLICK_RATE
    long_view = rng.random(total) < LONG_VIEW_RATE
    duration = rng.integers(5_000, 120_000, total)
    play = np.where(long_view, duration, (duration * rng.random(total)).astype(np.int64))
    dt = pl.Series(time_ms).cast(pl.Datetime("ms"))
    df = pl.DataFrame({
        "user_id": user,
        "video_id": video,
        "date": dt.dt.strftime("%Y%m%d").cast(pl.Int64),
        "hourmin": (dt.dt.hour().cast(pl.Int64) * 100 + dt.dt.minute().cast(pl.Int64)),
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
        "profile_stay_time": np.zeros(total, dtype=np.int64),
        "comment_stay_time": np.zeros(total, dtype=np.int64),
        "is_profile_enter": click & (rng.random(total) < 0.02),
        "is_rand": np.zeros(total, dtype=np.int64),
        "tab": rng.integers(0, 15, total),
    })
    return df.cast(LOG_SCHEMA)
