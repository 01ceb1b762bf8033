"""Resumable, verified downloads into a cache folder, and safe extraction.

    fetch(spec)    -> the archive in the cache, md5-checked (pooch.retrieve with a downloader
                      that resumes a partial file with an HTTP Range request)
    extract(spec)  -> the extracted folder, after a free-disk check
    log_paths(spec) -> the log files of a dataset, fetching and extracting what is missing

Cache: $GRLIB_CACHE_DIR, else the user cache (pooch.os_cache("grlib"), e.g. ~/.cache/grlib).
A download in progress lives in <cache>/<archive>.part; an interrupted one is resumed from its
last byte by the next call. A complete download is renamed to a temporary name, md5-checked by
pooch and only then moved to <cache>/<archive>; on a checksum mismatch nothing is left in the
cache. Archives extract into a temporary sibling folder renamed to <cache>/<dataset> when done.
"""
from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path

import pooch
import requests

from grlib.data.registry import DatasetSpec
from grlib.data.schema import DataError
from grlib.progress import bar

CHUNK = 1 << 20
DISK_MARGIN = 1.05  # extraction needs the published size plus 5%


class DownloadError(DataError):
    """A failed or interrupted download (the message says whether the next call resumes)."""


def cache_dir() -> Path:
    env = os.environ.get("GRLIB_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else Path(pooch.os_cache("grlib"))


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


class ResumableDownloader:
    """A pooch downloader that keeps a partial file (<cache>/<archive>.part) across calls and
    asks the server for the remaining bytes only (HTTP Range); tqdm progress via grlib.progress."""

    def __init__(self, part: Path, size: int | None = None, timeout: float = 60.0):
        self.part, self.size, self.timeout = Path(part), size, timeout

    def __call__(self, url: str, output_file: str, pooch_obj=None, check_only: bool = False) -> bool | None:
        if check_only:
            return requests.head(url, timeout=self.timeout, allow_redirects=True).ok
        have = self.part.stat().st_size if self.part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        resp = requests.get(url, headers=headers, stream=True, timeout=self.timeout)
        with resp:
            if resp.status_code == 416 and have and have == self.size:  # already complete
                os.replace(self.part, output_file)
                return None
            if resp.status_code == 200 and have:  # the server ignored the Range: start over
                have = 0
            elif resp.status_code == 206:
                start = int(resp.headers.get("Content-Range", "bytes 0-").split()[1].split("-")[0])
                if start != have:
                    raise DownloadError(f"{url}: asked for bytes from {have}, the server sent from {start}")
            elif not resp.ok:
                raise DownloadError(f"{url}: HTTP {resp.status_code} {resp.reason}")
            remaining = int(resp.headers.get("Content-Length", 0)) or None
            total = have + remaining if remaining else self.size
            got = have
            try:
                with open(self.part, "ab" if have else "wb") as fh, \
                        bar(total or 0, desc=self.part.name.removesuffix(".part"), unit="B",
                            unit_scale=True, initial=have) as progress:
                    resp.raw.enforce_content_length = False  # keep the bytes of a cut response; checked below
                    for chunk in resp.raw.stream(CHUNK, decode_content=False):
                        fh.write(chunk)
                        got += len(chunk)
                        progress.update(len(chunk))
            except (requests.RequestException, OSError) as err:
                raise DownloadError(f"{url}: interrupted at byte {got:,}"
                                    f"{f' of {total:,}' if total else ''} ({type(err).__name__}); "
                                    f"{self.part} is kept and the next call resumes from there") from err
            if total and got < total:
                raise DownloadError(f"{url}: the connection closed at byte {got:,} of {total:,}; "
                                    f"{self.part} is kept and the next call resumes from there")
        os.replace(self.part, output_file)  # pooch checks the md5, then moves it into the cache
        return None


def fetch(spec: DatasetSpec, cache: Path | None = None) -> Path:
    """The dataset's archive in the cache: downloaded (or resumed) and md5-verified."""
    cache = Path(cache) if cache else cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f"{spec.archive}.part"
    downloader = ResumableDownloader(part, spec.archive_bytes if spec.exact_size else None)
    try:
        path = pooch.retrieve(spec.url, known_hash=f"md5:{spec.md5}", fname=spec.archive, path=cache,
                              downloader=downloader, progressbar=False)
    except DataError:  # interrupted or refused download: the partial file stays for a resume
        raise
    except ValueError as err:  # pooch: hash mismatch (its temporary file is already deleted)
        part.unlink(missing_ok=True)
        raise DownloadError(f"{spec.url}: checksum mismatch, nothing kept in {cache} ({err})") from err
    except requests.RequestException as err:
        raise DownloadError(f"{spec.url}: {err}; a partial file, if any, is kept in {part}") from err
    return Path(path)


def _members_size(archive: Path) -> int:
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return sum(i.file_size for i in zf.infolist())
        with tarfile.open(archive, "r:*") as tf:
            return sum(m.size for m in tf)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:
        raise DataError(f"{archive}: truncated or corrupt archive ({type(err).__name__}: {err})") from err


def check_disk(folder: Path, needed: int, what: str) -> None:
    """DataError (with both sizes) when `folder`'s file system has less than needed * 1.05 free."""
    free = shutil.disk_usage(folder).free
    if free < needed * DISK_MARGIN:
        raise DataError(f"not enough disk to {what}: needs {_human(needed * DISK_MARGIN)} "
                        f"({needed:,} bytes + 5%), {_human(free)} ({free:,} bytes) free on {folder}")


def extract(archive: Path, dest: Path, needed: int | None = None) -> Path:
    """Extracts a .tar.gz or .zip into dest (atomically: a temporary sibling, then a rename).
    `needed` is the disk space it takes (default: the sum of the member sizes)."""
    archive, dest = Path(archive), Path(dest)
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    needed = needed if needed is not None else _members_size(archive)
    check_disk(dest.parent, needed, f"extract {archive.name}")
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)
        else:
            with tarfile.open(archive, "r:*") as tf:
                tf.extractall(tmp, filter="data")
        tmp.rename(dest)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError(f"{archive}: truncated or corrupt archive ({type(err).__name__}: {err}); "
                        f"nothing extracted") from err
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def find_files(folder: Path, names: tuple[str, ...]) -> list[Path]:
    """Each of `names` somewhere under folder (archives nest them, e.g. KuaiRand-27K/data/)."""
    found = []
    for name in names:
        hits = sorted(folder.rglob(name))
        if not hits:
            raise DataError(f"{folder}: {name} not found in the extracted archive")
        found.append(hits[0])
    return found


def log_paths(spec: DatasetSpec, cache: Path | None = None) -> list[Path]:
    """The dataset's log files, downloading and extracting whatever is not in the cache yet."""
    cache = Path(cache) if cache else cache_dir()
    folder = cache / spec.name
    if not folder.is_dir():
        extract(fetch(spec, cache), folder, spec.extracted_bytes)
    return find_files(folder, spec.log_files)
