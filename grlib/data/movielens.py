"""MovieLens-100K (a second real dataset with known behaviour) into the KuaiRand log schema.

Every rating is one event and one target (the usual leave-one-out protocol of SASRec / HSTU on
MovieLens); time_ms = unix seconds * 1000. Ratings >= 4 set is_like. A line longer than
preprocess.MAX_LINE_BYTES or a value that is not an integer is a DataError naming the file (and
the line), echoing at most a short escaped excerpt.
"""
from __future__ import annotations

from pathlib import Path

import polars as pl

from grlib.data.preprocess import check_lines
from grlib.schema import LOG_COLUMNS, LOG_SCHEMA, DataError, shown

ML100K_USERS, ML100K_ITEMS, ML100K_RATINGS = 943, 1682, 100_000


def read_ml100k(path: Path) -> pl.DataFrame:
    """u.data (user, item, rating, unix time; TAB-separated) -> 19-column log frame."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: MovieLens-100K ratings file (u.data) not found")
    check_lines(path)
    try:
        raw = pl.read_csv(path, separator="\t", has_header=False,
                          new_columns=["user_id", "video_id", "rating", "ts"],
                          schema_overrides={"user_id": pl.Int64, "video_id": pl.Int64, "rating": pl.Int64,
                                            "ts": pl.Int64})
    except pl.exceptions.PolarsError as err:
        raise DataError(f"{path}: not a MovieLens ratings file (user, item, rating, time, TAB-separated "
                        f"integers): {shown(' '.join(str(err).split()))}") from err
    log = raw.select(
        "user_id", "video_id",
        (pl.col("ts") * 1000).alias("time_ms"),
        pl.lit(1).alias("is_click"),
        (pl.col("rating") >= 4).cast(pl.Int8).alias("is_like"),
    )
    missing = [c for c in LOG_COLUMNS if c not in log.columns]
    return log.with_columns(pl.lit(0).alias(c) for c in missing).select(LOG_COLUMNS).cast(LOG_SCHEMA)
