"""The KuaiRand log schema (19 columns, all versions), the action bitmask, the reserved item ids,
DataError and `shown` (what an error message may echo of a file: truncated, control bytes
escaped): a vocabulary that the config's checks and every layer above read (it imports nothing of
grlib, so it sits in the base layer; tests/test_layers.py).

KuaiRand's README documents every log column as int64. LOG_SCHEMA keeps int64 for ids, times and
durations and reads the 0/1 signals as int8 (the same values in an eighth of the memory).

Importing the module loads no polars (the command line's parser and the config read DataError and
the action bits): LOG_SCHEMA, column -> polars dtype, is built from LOG_DTYPES on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

LOG_DTYPES: dict[str, str] = {  # column -> polars dtype name (LOG_SCHEMA)
    "user_id": "Int64",
    "video_id": "Int64",
    "date": "Int64",  # YYYYMMDD
    "hourmin": "Int64",  # HHMM
    "time_ms": "Int64",  # unix epoch milliseconds
    "is_click": "Int8",
    "is_like": "Int8",
    "is_follow": "Int8",
    "is_comment": "Int8",
    "is_forward": "Int8",
    "is_hate": "Int8",
    "long_view": "Int8",
    "play_time_ms": "Int64",
    "duration_ms": "Int64",
    "profile_stay_time": "Int64",
    "comment_stay_time": "Int64",
    "is_profile_enter": "Int8",
    "is_rand": "Int8",
    "tab": "Int64",
}
LOG_COLUMNS = tuple(LOG_DTYPES)
FLAG_COLUMNS = ("is_click", "is_like", "is_follow", "is_comment", "is_forward", "is_hate", "long_view",
                "is_profile_enter", "is_rand")  # 0/1 signals: any other value is a DataError


class DataError(ValueError):
    """Bad input data: the message names the file and, where known, the line and column."""


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(text: str | bytes, limit: int = 200, total: int | None = None) -> str:
    """`text` (a file's content, a value read from it) as an error message may echo it: control and
    other non-printable characters escaped as repr writes them (NUL as \\x00, ESC as \\x1b, a byte
    that is not UTF-8 as \\xNN, a backslash doubled), at most `limit` characters of escaped text and,
    when that is not all of it, "... (N characters in all)" ("N bytes" for bytes). `total`: the
    length of the original when `text` is only its beginning."""
    is_bytes = isinstance(text, bytes)
    length = len(text) if total is None else total
    head = text[:4 * limit].decode("utf-8", errors="surrogateescape") if is_bytes else text[:limit]
    pieces, used, covered = [], 0, 0  # covered: characters (bytes) of the original shown
    for char in head:
        if char in _ESCAPES:
            piece = _ESCAPES[char]
        elif "\udc80" <= char <= "\udcff":  # a byte that is not UTF-8 (surrogateescape)
            piece = f"\\x{ord(char) - 0xdc00:02x}"
        else:
            piece = char if char.isprintable() else repr(char)[1:-1]
        if used + len(piece) > limit:
            break
        pieces.append(piece)
        used += len(piece)
        covered += len(char.encode("utf-8", errors="surrogateescape")) if is_bytes else 1
    more = f"... ({length:,} {'bytes' if is_bytes else 'characters'} in all)" if covered < length else ""
    return "".join(pieces) + more


# Public practice (generative-recommenders dlrm_v3, NVIDIA recsys-examples).
ACTION_BITS: dict[str, int] = {
    "is_click": 1,
    "is_like": 2,
    "is_follow": 4,
    "is_comment": 8,
    "is_forward": 16,
    "is_hate": 32,
    "long_view": 64,
    "is_profile_enter": 128,
}
N_ACTION_CODES = 256  # every bitmask value

PAD_ID = 0  # padding / "no target"
OOV_ID = 1  # items below min_item_count
FIRST_ITEM_ID = 2


def __getattr__(name: str):
    if name == "LOG_SCHEMA":  # `from grlib.schema import LOG_SCHEMA` too (PEP 562)
        import polars as pl

        schema: dict[str, pl.DataType] = {column: getattr(pl, dtype) for column, dtype in LOG_DTYPES.items()}
        globals()["LOG_SCHEMA"] = schema
        return schema
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def action_mask_expr() -> pl.Expr:
    """The action bitmask of a log row as a polars expression (Int16); a signal counts when > 0."""
    import polars as pl

    expr = None
    for column, bit in ACTION_BITS.items():
        term = (pl.col(column) > 0).cast(pl.Int16) * bit
        expr = term if expr is None else expr | term
    return expr.alias("action")
