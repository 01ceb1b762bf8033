"""`python -m grlib clean [--dry-run] [--path DIR ...]` (and `make clean-tmp`): the leftovers of grlib
runs that ended without finishing (kill -9, a power cut), listed and removed.

    python -m grlib clean --dry-run               what would go, and what stays and why
    python -m grlib clean --path ckpt --path runs/a    also these folders (e.g. --checkpoint-dir's)

Places, each walked with its subfolders: data/ (GRLIB_DATA_DIR: raw/, processed/, cache/arrays/),
results/ (GRLIB_RESULTS_DIR), every --path, and the download cache (grlib.data.download.cache_dir).
A leftover is a path of grlib's temporary naming (grlib.io: .<name>.grlib-<pid>-<host>-XXXXXXXX.tmp /
.old) whose owner has ended, or a lock file no run holds; a temporary path of a running process or
of another host is listed and kept. In the download cache, an <archive>.part is a download to resume
(the next `data download` continues from its last byte): listed, never removed. Nothing else is
read or removed. One row per path: size, owner pid, why; then the total.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from grlib import io, paths


class CleanError(ValueError):
    """A --path that is not a folder."""


SKIPPED = {".git", ".venv", ".dvc", "__pycache__", "node_modules"}  # never walked into


def places(extra: list[Path]) -> list[tuple[Path, bool]]:
    """(folder, is the download cache) of every place grlib writes, then the --path folders."""
    from grlib.data.download import cache_dir

    return [(paths.data_dir(), False), (paths.results_dir(), False), *((p, False) for p in extra),
            (cache_dir(), True)]


def scan(folder: Path, cache: bool) -> list[dict]:
    """The rows of `folder` and its subfolders: each grlib temporary path or free lock file (io.Leftover),
    and in the download cache each .part file."""
    rows = []
    for base, dirs, files in os.walk(folder):
        found = io.find_leftovers(Path(base))
        taken = {item.path.name for item in found}
        dirs[:] = sorted(d for d in dirs if d not in taken and d not in SKIPPED)  # a leftover folder is one row
        rows += [{"path": item.path, "size": item.size, "pid": item.pid, "why": item.why, "leftover": item}
                 for item in found]
        for f in sorted(files) if cache else []:
            part = Path(base) / f
            if f.endswith(".part") and not f.startswith(".") and part.is_file():
                rows.append({"path": part, "size": part.stat().st_size, "pid": None,
                             "why": "resumable download: kept (the next `data download` resumes it)",
                             "leftover": None})
    return rows


def shown(path: Path) -> str:
    """A path relative to the working folder when it lies below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _clean(args: argparse.Namespace) -> int:
    extra = [Path(p) for p in args.path]
    for p in extra:
        if not p.is_dir():
            raise CleanError(f"--path {p}: {'not found' if not p.exists() else 'not a folder'}")
    rows, seen = [], set()
    for folder, cache in places(extra):
        for row in scan(folder, cache) if folder.is_dir() else []:
            key = row["path"].absolute()
            if key not in seen:
                seen.add(key)
                rows.append(row)
    removable = [r for r in rows if r["leftover"] is not None and r["leftover"].ended]
    if not args.dry_run:
        for r in removable:
            if io.remove_leftover(r["leftover"]):
                r["why"] += ": removed"
            else:
                r["why"] += ": taken again meanwhile, kept"
        removable = [r for r in removable if r["why"].endswith(": removed")]
    elif removable:
        for r in removable:
            r["why"] += ": would be removed"
    if rows:
        cells = [(io.human_bytes(r["size"]), "-" if r["pid"] is None else str(r["pid"]), r["why"], shown(r["path"]))
                 for r in rows]
        head = ("size", "pid", "why", "path")
        widths = [max(len(c[i]) for c in [head, *cells]) for i in range(3)]
        for line in [head, *cells]:
            print(f"{line[0]:>{widths[0]}}  {line[1]:>{widths[1]}}  {line[2]:<{widths[2]}}  {line[3]}")
    total = io.human_bytes(sum(r["size"] for r in removable))
    kept = len(rows) - len(removable)
    tail = f"; {kept} kept" if kept else ""
    where = ", ".join(shown(f) for f, _ in places(extra))
    if not removable:
        print(f"nothing to remove{tail} (looked in {where})")
    elif args.dry_run:
        print(f"would remove {len(removable)} leftover{'s' * (len(removable) > 1)} of ended grlib runs ({total})"
              f"{tail}; --dry-run: nothing removed")
    else:
        print(f"removed {len(removable)} leftover{'s' * (len(removable) > 1)} of ended grlib runs ({total}){tail}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clean", help="list and remove the temporary files and folders of grlib runs that were "
                                     "killed (data/, results/, the download cache, --path folders)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="list what would be removed; remove nothing")
    p.add_argument("--path", action="append", default=[], metavar="DIR",
                   help="also clean this folder and its subfolders (e.g. a --checkpoint-dir); repeatable")
    p.set_defaults(func=_clean)
