"""Real data through the same code path: KuaiRand-Pure log slices (all 19 columns, documented
dtypes), a real 27K derivative with other columns (refused, naming them), MovieLens-100K."""
from __future__ import annotations

import polars as pl
import pytest

from grlib.config import DataConfig
from grlib.data.movielens import ML100K_ITEMS, ML100K_RATINGS, ML100K_USERS, read_ml100k
from grlib.data.preprocess import prepare_logs, read_log
from grlib.schema import LOG_COLUMNS, LOG_SCHEMA, DataError
from grlib.data.catalog import prepare_to

PURE = ("kuairand_pure/log_standard_4_08_to_4_21_pure.SLICE_from_notebook.csv",
        "kuairand_pure/log_standard_4_22_to_5_08_pure.TAIL5_from_notebook.csv")


def test_kuairand_pure_slices_parse_with_all_columns_and_dtypes(real_data):
    first, tail = (read_log(real_data / name) for name in PURE)
    for df in (first, tail):
        assert df.columns == list(LOG_COLUMNS) and dict(df.schema) == LOG_SCHEMA
    assert (first.height, tail.height) == (25, 5)
    assert first.row(0) == (0, 1527, 20220411, 1900, 1649675512388, 0, 0, 0, 0, 0, 0, 0, 1385, 209900, 0, 0, 0, 0, 1)
    assert tail.row(-1, named=True)["user_id"] == 27284 and tail["date"].min() >= 20220422


def test_kuairand_pure_slices_through_the_streaming_preprocessing(real_data, tmp_path):
    files = [real_data / name for name in PURE]
    stats = prepare_logs(files, tmp_path / "out", max_len=8, target="all", bucket_rows=1000)
    both = pl.concat([read_log(f) for f in files])
    per_user = both.group_by("user_id").len()
    assert stats["rows"] == both.height == 30
    assert stats["users_in_log"] == per_user.height and stats["users"] == (per_user["len"] >= 3).sum()
    assert stats["items"] == both["video_id"].n_unique()
    assert stats["click_rate"] == pytest.approx(both["is_click"].cast(pl.Float64).mean())
    seqs = pl.read_parquet(tmp_path / "out" / "sequences.parquet")
    user3 = seqs.filter(pl.col("user_id") == 3).row(0, named=True)
    assert user3["n_events"] == both.filter(pl.col("user_id") == 3).height
    assert user3["timestamps"] == sorted(user3["timestamps"])


def test_a_real_27k_file_without_the_log_columns_is_refused(real_data, tmp_path):
    path = real_data / "kuairand_27k" / "log_standard_history_window_examples_27k.csv"
    with pytest.raises(DataError, match=r"log_standard_history_window_examples_27k.csv, line 1: missing columns "
                                        r"'is_like', 'is_follow', .*'is_rand' \(header: user_id, time_ms, "):
        prepare_logs([path], tmp_path / "out", max_len=8)
    assert not (tmp_path / "out").exists()


def test_movielens_100k_users_items_and_sequences(real_data, tmp_path, monkeypatch):
    log = read_ml100k(real_data / "movielens_100k" / "u.data")
    assert log.columns == list(LOG_COLUMNS) and log.height == ML100K_RATINGS
    assert (log["user_id"].n_unique(), log["video_id"].n_unique()) == (ML100K_USERS, ML100K_ITEMS) == (943, 1682)
    monkeypatch.setenv("GRLIB_DATA_DIR", str(tmp_path / "data"))
    stats = prepare_to(DataConfig(dataset="ml-100k", max_len=200), tmp_path / "ml")
    assert (stats["users"], stats["items"], stats["rows"]) == (943, 1682, 100_000)
    assert stats["raw_length_min"] == 20  # every MovieLens-100K user rated at least 20 movies
