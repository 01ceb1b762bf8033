"""`python -m grlib import-rows FILE.json ...`: the rows of a device check (grlib.probes.device_check,
OUT/device_check.json, measured on another machine) appended to the committed result tables.

    python -m grlib import-rows device_check.json [--adhoc]

Each (table, scale) of the file's rows becomes one new part file of results/tables/<table>/
scale=<scale>/ (bench_kernels, bench_train), so the report reads them beside the CPU's rows. The
rows keep the metadata they were measured with (run_id, git_rev, params_hash, hardware naming the
device, UTC timestamp), not this machine's. Every file is read and checked before anything is
written; a run already in a table is refused (no row twice)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from grlib.schema import DataError

TABLES = ("bench_kernels", "bench_train")  # the tables a device check writes rows of
REQUIRED = ("table", "run_id", "git_rev", "params_hash", "scale", "hardware", "timestamp")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-rows", help="append a device check's JSON rows (grlib.probes.device_check) to the "
                                           "committed result tables")
    p.add_argument("files", nargs="+", type=Path, help="device_check.json files")
    p.add_argument("--adhoc", action="store_true", help="append to results/adhoc/tables/ (not in git) instead")
    p.set_defaults(func=run)


def read_rows(path: Path) -> dict[tuple[str, str], list[dict]]:
    """{(table, scale): rows} of one device check file; DataError naming the file on anything else."""
    from grlib import results

    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable JSON file ({err})") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise DataError(f"{path}: no rows (a device check's JSON has a non-empty 'rows' list)")
    groups: dict[tuple[str, str], list[dict]] = {}
    for i, row in enumerate(rows):
        missing = [k for k in REQUIRED if not isinstance(row, dict) or k not in row]
        if missing:
            raise DataError(f"{path}: row {i} lacks {', '.join(missing)}")
        if row["table"] not in TABLES:
            raise DataError(f"{path}: row {i} names table {row['table']!r}; expected one of {', '.join(TABLES)}")
        try:
            results.check_scale(row["scale"])
            dt.datetime.fromisoformat(row["timestamp"])
            json.loads(row["hardware"])
        except (ValueError, TypeError) as err:
            raise DataError(f"{path}: row {i}: {err}") from None
        groups.setdefault((row["table"], row["scale"]), []).append({k: v for k, v in row.items() if k != "table"})
    return groups


def check_new(table: str, scale: str, rows: list[dict], adhoc: bool = False) -> None:
    """DataError when a run of `rows` is in table/scale already."""
    from grlib import results

    have = results.read_table(table, scale, adhoc=adhoc)
    if have.height and "run_id" in have.columns:
        again = sorted({r["run_id"] for r in rows} & set(have["run_id"].to_list()))
        if again:
            raise DataError(f"{results.scale_dir(table, scale, adhoc)}: run {', '.join(again)} is there already")


def append(table: str, scale: str, rows: list[dict], adhoc: bool = False) -> Path:
    """One part file of `rows` in table/scale, with the rows' own metadata."""
    import polars as pl

    from grlib import results

    frame = pl.DataFrame(rows, infer_schema_length=None)
    when = max(dt.datetime.fromisoformat(r["timestamp"]) for r in rows).astimezone(dt.timezone.utc)
    path = results.scale_dir(table, scale, adhoc) / results._part_name(when, rows[0]["run_id"])
    return results.atomic_write_parquet(frame, path)


def run(args: argparse.Namespace) -> int:
    groups: dict[tuple[str, str], list[dict]] = {}
    for path in args.files:  # every file and table checked before any part is written
        for key, rows in read_rows(path).items():
            groups.setdefault(key, []).extend(rows)
    for (table, scale), rows in groups.items():
        check_new(table, scale, rows, args.adhoc)
    for (table, scale), rows in sorted(groups.items()):
        devices = sorted({json.loads(r["hardware"]).get("device", "?") for r in rows})
        written = append(table, scale, rows, args.adhoc)
        print(f"{len(rows)} rows of {', '.join(devices)} -> {written}")
    return 0
