"""Safe writes: every file grlib writes appears whole or not at all, with the caller's umask, and an
output folder is only ever replaced when grlib made it.

    atomic_write_bytes(path, data)            temp file in the same folder -> fsync -> rename
    atomic_write(path, lambda tmp: ...)       the same for any writer that takes a path
    with output_dir(out, what="prepared data") as tmp:   build a folder in tmp; on success it
        ...                                   replaces `out` (only if `out` is absent, empty, or
                                              carries grlib's marker), else OutputRefused

A folder without the marker is never replaced unless it is empty, whatever its files are called:
a user's own stats.json is as safe as their thesis.

`tempfile.mkstemp` / `mkdtemp` create 0600 / 0700 whatever the umask; files made here get
0666 & ~umask and folders 0777 & ~umask, like `open()` and `mkdir` would.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

MARKER = ".grlib-output"  # file inside every folder grlib built with output_dir()


class OutputRefused(ValueError):
    """An output path grlib will not write over (a folder it did not create, or the working folder)."""


def umask() -> int:
    """The process umask (read without changing it where /proc allows)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def atomic_write(path: str | Path, write: Callable[[Path], object], mode: int | None = None) -> Path:
    """Calls write(tmp) on a temporary path in `path`'s folder, then renames it over `path`.
    A crash or an exception leaves `path` as it was and no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def is_grlib_output(folder: Path) -> bool:
    """`folder` carries grlib's marker (a plain file, not a link)."""
    marker = folder / MARKER
    return marker.is_file() and not marker.is_symlink()


def check_replaceable(out: Path) -> None:
    """Raises OutputRefused unless `out` may be replaced: absent, an empty folder, or a folder
    grlib made (is_grlib_output); never the working folder, one of its parents, or the project root."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise OutputRefused(f"{out}: exists and is not a folder grlib made; choose another output path")
    real = out.resolve()
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise OutputRefused(f"{out}: is the working folder or one of its parents; grlib writes outputs into "
                            f"a folder of their own (e.g. {out / 'prepared'})")
    if (real / ".git").exists() or (real / "params.yaml").is_file():
        raise OutputRefused(f"{out}: holds a project checkout (.git or params.yaml); choose another output path")
    if any(real.iterdir()) and not is_grlib_output(real):
        held = sorted(e.name for e in real.iterdir())
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise OutputRefused(f"{out}: folder is not empty and was not made by grlib (no {MARKER} file; it holds "
                            f"{shown}); grlib never deletes files it did not create: choose an empty or new folder")


@contextlib.contextmanager
def output_dir(out: str | Path, what: str = "output") -> Iterator[Path]:
    """Yields a temporary sibling folder of `out`; when the block ends without error, writes the
    marker into it and renames it to `out` (replacing a previous grlib output there). On error the
    temporary folder is removed and `out` is left as it was."""
    out = Path(out)
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~umask())
    try:
        yield tmp
        # no timestamp: the same inputs give a byte-identical folder (DVC hashes it)
        (tmp / MARKER).write_text(json.dumps({"what": what}) + "\n")
        check_replaceable(out)  # again: something may have appeared there meanwhile
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
            old.rmdir()
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
