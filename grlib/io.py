"""Safe writes: every file grlib writes appears whole or not at all, with the caller's umask, and an
output folder is only ever replaced when grlib made it; what a killed run leaves is removed later.

    atomic_write_bytes(path, data)            temp file in the same folder -> fsync -> rename
    atomic_write(path, lambda tmp: ...)       the same for any writer that takes a path
    with output_dir(out, what="prepared data") as tmp:   build a folder in tmp; on success it
        ...                                   replaces `out` (only if `out` is absent, empty, or
                                              carries grlib's marker), else OutputRefused
    temp_file(folder, name) / temp_dir(folder, name)     a temporary path of grlib's naming
    find_leftovers(folder), sweep(folder)     the temporaries of ended runs in a folder; remove them

A folder without the marker is never replaced unless it is empty, whatever its files are called:
a user's own stats.json is as safe as their thesis.

`tempfile.mkstemp` / `mkdtemp` create 0600 / 0700 whatever the umask; files made here get
0666 & ~umask and folders 0777 & ~umask, like `open()` and `mkdir` would.

Temporary names carry their owner: every temporary path grlib makes beside an output is

    .<name>.grlib-<pid>-<host>-<8 random characters><suffix>     e.g. .last.pt.grlib-4242-node1-k3j9x0qa.tmp

(suffix .tmp, .old, or .tmp.<ext>; host: this machine's name, letters and digits only, at most 24),
so a run killed with SIGKILL (or a power cut) leaves names that say whose they were. Before making
one, temp_file / temp_dir remove the siblings of that pattern whose owner has ended (sweep): the
same host, and the pid gone (os.kill(pid, 0) raises ProcessLookupError; PermissionError is a live
process of another user) or a zombie, or the pid now names a process that started more than
PID_REUSE_SLACK_S after the entry was last written (the pid was reused, as a restarted container
reuses small pids: the process that wrote it is gone). A live owner's path is never removed: a pid
reused by a process that started before the leftover's last write keeps that leftover until that
process ends (rare, and it only ever errs on keeping). A path written on another host (a shared
folder) is left alone: its pids mean nothing here. Nothing else is touched: only names that match
the pattern exactly. Each sweep that removed something prints one line on stderr
(grlib.progress.log) with what and how much.

Finishing an output (the renames at the end of output_dir) holds an flock on `.<out>.grlib-lock`
beside it, so two runs finishing the same `out` at the same instant take turns: the second replaces
the first's folder and says so in one line; the lock file is removed when the finish ends.

is_disk_full(err) tells a full disk (ENOSPC, EDQUOT, or a library's message saying so) from other
errors; file_system(path) is the mount point a folder lives on.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

MARKER = ".grlib-output"  # file inside every folder grlib built with output_dir()
PID_REUSE_SLACK_S = 60.0  # a pid's process started this long after a leftover's last write did not write it
# .<name>.grlib-<pid>-<host>-<random><suffix>; random: tempfile's 8 characters
TEMP_PATTERN = re.compile(r"\.(?P<name>.+)\.grlib-(?P<pid>[1-9]\d{0,9})-(?P<host>[A-Za-z0-9]{1,24})-[a-z0-9_]{8}"
                          r"(?P<suffix>\.(?:tmp|old)(?:\.[A-Za-z0-9]{1,16})?)")
LOCK_SUFFIX = ".grlib-lock"  # .<out>.grlib-lock: held while a run finishes `out`


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


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (powers of 1000, as `df -H` and the download messages)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# --- temporary names and the leftovers of ended runs ------------------------------------------------

def host_tag() -> str:
    """This machine's name as temporary names carry it: letters and digits, at most 24."""
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:24] or "host"


def temp_prefix(name: str) -> str:
    """The start of a temporary name for `name` made by this process: .<name>.grlib-<pid>-<host>-"""
    return f".{name}.grlib-{os.getpid()}-{host_tag()}-"


def temp_file(folder: Path, name: str, suffix: str = ".tmp") -> Path:
    """An empty file of grlib's temporary naming in `folder` (mode 0666 & ~umask), after removing
    the leftovers of ended runs there (sweep). The caller renames or deletes it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sweep(folder)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=temp_prefix(name), suffix=suffix)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~umask())
    return Path(tmp)


def temp_dir(folder: Path, name: str, suffix: str = ".tmp") -> Path:
    """An empty folder of grlib's temporary naming in `folder` (mode 0777 & ~umask), after removing
    the leftovers of ended runs there (sweep). The caller renames or deletes it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sweep(folder)
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=temp_prefix(name), suffix=suffix))
    os.chmod(tmp, 0o777 & ~umask())
    return tmp


@dataclass(frozen=True)
class Leftover:
    """A path of grlib's temporary naming (or a lock file) and whether its owner has ended."""
    path: Path
    pid: int | None  # None: a lock file (it names no owner)
    host: str
    size: int  # bytes of its files (a folder: everything under it)
    ended: bool  # its owner is gone: removable
    why: str  # e.g. "pid 4242 ended", "pid 4242 running", "written on host node2"


def _proc_stat(pid: int) -> tuple[str, float] | None:
    """(state letter, start time in seconds since the epoch) of process `pid` from /proc; None
    where unknown (no /proc: macOS)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        with open("/proc/stat") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return fields[0], boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # fields 3 and 22 (starttime, ticks)
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def owner_running(pid: int, last_written: float) -> bool:
    """Process `pid` may be the one that wrote a path last modified at `last_written`: it exists
    (or belongs to another user), is not a zombie (ended, not yet reaped by its parent) and did
    not start more than PID_REUSE_SLACK_S after that write."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    return state not in ("Z", "X") and started <= last_written + PID_REUSE_SLACK_S


def _size(path: Path) -> int:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return 0
    if not path.is_dir() or path.is_symlink():
        return st.st_size
    total = 0
    for base, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, f)).st_size
    return total


def _take_free_lock(path: Path, remove: bool) -> bool:
    """Whether no run holds lock file `path` (an flock taken at once); with `remove`, a free one is
    deleted while held, so that a run that opened it before sees it gone and opens anew (finish_lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        if remove:
            path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)  # lets go of the lock


def find_leftovers(folder: Path, sizes: bool = True) -> list[Leftover]:
    """The entries of `folder` (not below) of grlib's temporary naming, each with whether its owner
    has ended, and the lock files no run holds; sorted by name. sizes=False: sizes only for the
    ended ones (a live run's folder is not walked)."""
    here = host_tag()
    found = []
    try:
        with os.scandir(folder) as it:
            entries = sorted((e for e in it if e.name.startswith(".")), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        if not entry.name.startswith(".") or ".grlib-" not in entry.name:  # most names: nothing more to read
            continue
        path = Path(entry.path)
        if entry.name.endswith(LOCK_SUFFIX) and entry.is_file(follow_symlinks=False):
            if _take_free_lock(path, remove=False):
                found.append(Leftover(path, None, here, _size(path), True, "lock file no run holds"))
            continue
        m = TEMP_PATTERN.fullmatch(entry.name)
        if m is None:
            continue
        pid, host = int(m["pid"]), m["host"]
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:  # its owner just renamed or removed it
            continue
        ended = host == here and not owner_running(pid, mtime)
        why = (f"pid {pid} ended" if ended else f"written on host {host}: kept" if host != here
               else f"pid {pid} running: kept")
        found.append(Leftover(path, pid, host, _size(path) if sizes or ended else 0, ended, why))
    return found


def remove_leftover(item: Leftover) -> bool:
    """Deletes an ended owner's leftover (a folder with everything in it; a lock file only while
    no run holds it); whether it is gone."""
    if item.pid is None:
        return _take_free_lock(item.path, remove=True)
    if item.path.is_dir() and not item.path.is_symlink():
        shutil.rmtree(item.path, ignore_errors=True)
    else:
        item.path.unlink(missing_ok=True)
    return not item.path.exists() and not item.path.is_symlink()


def sweep(folder: Path) -> list[Leftover]:
    """Removes the leftovers of ended runs in `folder` (find_leftovers: grlib's temporary names only)
    and says so in one line on stderr; returns what it removed."""
    gone = [item for item in find_leftovers(folder, sizes=False) if item.ended and remove_leftover(item)]
    if gone:
        shown = ", ".join(f"{i.path.name} ({i.why}, {human_bytes(i.size)})" for i in gone[:3])
        more = f" and {len(gone) - 3} more" if len(gone) > 3 else ""
        _say(f"{folder}: removed {len(gone)} leftover{'s' * (len(gone) > 1)} of ended grlib runs "
             f"({human_bytes(sum(i.size for i in gone))}): {shown}{more}")
    return gone


def _say(message: str) -> None:
    """One line on stderr through grlib.progress.log (silent under GRLIB_PROGRESS=0); plain print
    where its tqdm is not installed (the device check's bare GPU machine)."""
    try:
        from grlib.progress import log
    except ImportError:
        print(message, file=sys.stderr, flush=True)
        return
    log(message)


def _hold_lock(lock: Path) -> int | None:
    """An fd holding an exclusive flock on the file `lock` now names (created if absent; waits for
    another holder); None on a file system without locks (some FUSE mounts)."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            lock.unlink(missing_ok=True)
            return None
        try:  # the holder before us may have removed the file: then ours is no lock, open it anew
            held, now = os.fstat(fd), os.stat(lock)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextlib.contextmanager
def finish_lock(out: Path) -> Iterator[None]:
    """Holds an exclusive flock on `.<out>.grlib-lock` beside `out` (waiting for another holder) and
    removes that file on exit, while still holding it: a waiter then finds its file gone and opens
    the name anew, so two runs never hold two different files. Without locks on the file system the
    block runs unserialised."""
    out = Path(out)
    lock = out.parent / f".{out.name}{LOCK_SUFFIX}"
    fd = _hold_lock(lock)
    try:
        yield
    finally:
        if fd is not None:
            lock.unlink(missing_ok=True)
            os.close(fd)


# --- a full disk -------------------------------------------------------------------------------------

_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "os error 28)", "os error 122)")


def is_disk_full(err: BaseException) -> bool:
    """`err` or an exception it was raised from is a full disk or quota: an OSError with ENOSPC /
    EDQUOT, or an OSError, polars or pyarrow error whose text says so (polars: "No space left on
    device (os error 28)"). The text of other errors (grlib's, which may echo a file's content) is
    not read."""
    seen: BaseException | None = err
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        library = type(seen).__module__.split(".")[0] in ("polars", "pyarrow")
        if (isinstance(seen, OSError) or library) and any(text in str(seen) for text in _DISK_FULL_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def file_system(path: Path) -> Path:
    """The mount point of the file system that holds `path` (or its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    dev = path.stat().st_dev
    while path != path.parent and path.parent.stat().st_dev == dev:
        path = path.parent
    return path


# --- atomic files and output folders -----------------------------------------------------------------

def atomic_write(path: str | Path, write: Callable[[Path], object], mode: int | None = None) -> Path:
    """Calls write(tmp) on a temporary path in `path`'s folder (temp_file: the leftovers of ended
    runs there go first), then renames it over `path`. A crash or an exception leaves `path` as it
    was; an exception leaves no temporary file behind (a crash's goes at the next write there)."""
    path = Path(path)
    tmp = temp_file(path.parent, path.name)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, mode if mode is not None else 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def output_dir(out: str | Path, what: str = "output") -> Iterator[Path]:
    """Yields a temporary sibling folder of `out` (temp_dir: the leftovers of ended runs beside it
    go first); when the block ends without error, writes the marker into it and renames it to `out`
    (replacing a previous grlib output there) under finish_lock. Another run that wrote `out` while
    this one ran is replaced too, with one line on stderr saying so. On error the temporary folder
    is removed and `out` is left as it was."""
    out = Path(out)
    check_replaceable(out)
    before = _identity(out)
    tmp = temp_dir(out.parent, out.name)
    try:
        yield tmp
        # no timestamp: the same inputs give a byte-identical folder (DVC hashes it)
        (tmp / MARKER).write_text(json.dumps({"what": what}) + "\n")
        old = None
        with finish_lock(out):
            check_replaceable(out)  # again: something may have appeared there meanwhile
            now = _identity(out)
            if now is not None and now != before:
                _say(f"{out}: another run wrote it while this one ran; this run's {what} replaces it")
            if now is not None:
                old = Path(tempfile.mkdtemp(dir=out.parent, prefix=temp_prefix(out.name), suffix=".old"))
                old.rmdir()
                os.replace(out, old)
            os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
