"""Resumable, verified downloads into a cache folder, and safe extraction.

    fetch(spec)    -> the archive in the cache, md5-checked (pooch.retrieve with a downloader
                      that resumes a partial file with an HTTP Range request)
    extract(spec)  -> the extracted folder, after a free-disk check
    log_paths(spec) -> the log files of a dataset, fetching and extracting what is missing
    find_files(folder, names) -> the named files anywhere under a folder (`data prepare --raw-dir`)

Cache: $GRLIB_CACHE_DIR, else the user cache (pooch.os_cache("grlib"), e.g. ~/.cache/grlib).
A download in progress lives in <cache>/<archive>.part; an interrupted one is resumed from its
last byte by the next call. A complete download is renamed to a temporary name, md5-checked by
pooch and only then moved to <cache>/<archive>; on a checksum mismatch nothing is left in the
cache. Archives extract into a temporary sibling folder renamed to <cache>/<dataset> when done.

Size: a download writes at most size_limit(spec) bytes, the registry's archive_bytes plus a margin
(max(1 MiB, 1%) where the size is exact, max(1 MiB, 10%) where it is approximate: the registry's
figures are rounded). A server that announces more (Content-Length) is refused before a byte is
written; one that sends more without announcing it (chunked, or until it closes) is cut off at
the limit; either way the `.part` is removed, since it cannot be the archive, and DownloadError
says so in one line. A `.part` found longer than the archive can be (over the limit, or over an
exact size) is removed with a note on stderr and the download starts from byte 0; one the server
answers 416 (Range Not Satisfiable) for, at the file's length, is the whole file and goes on to
the md5 check.

Mirror: `mirror=URL` (CLI `--mirror URL`), else the environment variable GRLIB_MIRROR, replaces
the base of the registry URL and keeps its file name: GRLIB_MIRROR=https://mirror.example/kuairand
fetches https://mirror.example/kuairand/KuaiRand-27K.tar.gz. The md5 is checked all the same.

Disk: before a download starts, the cache's file system must have the archive's bytes (less a
partial file already there) plus 5% free, and log_paths also asks for the extracted size up
front; else DownloadError with the folder, the bytes needed and the bytes free. A disk that fills
up mid-download (ENOSPC, EDQUOT) raises DownloadError saying so and how many bytes are still
needed; the partial file is kept and the next call resumes from it.
"""
from __future__ import annotations

import errno
import logging
import math
import os
import posixpath
import re
import shutil
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path
from urllib.parse import urlparse

import pooch
import requests

from grlib import io
from grlib.data.registry import DatasetSpec
from grlib.schema import DataError
from grlib.progress import bar

CHUNK = 1 << 20
MiB = 1 << 20
DISK_MARGIN = 1.05  # a download or an extraction needs its size plus 5%
MIRROR_ENV = "GRLIB_MIRROR"


class DownloadError(DataError):
    """A failed or interrupted download (the message says whether the next call resumes)."""


def cache_dir() -> Path:
    env = os.environ.get("GRLIB_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else Path(pooch.os_cache("grlib"))


def mirror_url(url: str, mirror: str | None = None) -> str:
    """`url`, or its file name under `mirror` (else under $GRLIB_MIRROR) when one is given."""
    source = "--mirror" if mirror else MIRROR_ENV
    mirror = mirror or os.environ.get(MIRROR_ENV) or None
    if mirror is None:
        return url
    parsed = urlparse(mirror)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise DownloadError(f"{source} {mirror!r}: not an http(s) URL (expected e.g. https://host/folder)")
    return mirror.rstrip("/") + "/" + posixpath.basename(urlparse(url).path)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def size_limit(spec: DatasetSpec) -> int:
    """The most bytes a download of spec's archive may write: archive_bytes plus max(1 MiB, 1%)
    where the size is exact, plus max(1 MiB, 10%) where it is approximate (a rounded figure:
    "47 MB", "1.1 GB"). Every entry has a size, so every download has a bound."""
    share = 0.01 if spec.exact_size else 0.10
    return spec.archive_bytes + max(MiB, math.ceil(spec.archive_bytes * share))


class ResumableDownloader:
    """A pooch downloader that keeps a partial file (<cache>/<archive>.part) across calls and
    asks the server for the remaining bytes only (HTTP Range); tqdm progress via grlib.progress.

    size: the archive's exact size, where known; limit: the most bytes the file may reach
    (size_limit; None: no bound); `what` names that size in messages."""

    def __init__(self, part: Path, size: int | None = None, timeout: float = 60.0, limit: int | None = None,
                 what: str = "the registry's size"):
        self.part, self.size, self.timeout, self.limit, self.what = Path(part), size, timeout, limit, what

    def __call__(self, url: str, output_file: str, pooch_obj=None, check_only: bool = False) -> bool | None:
        if check_only:
            return requests.head(url, timeout=self.timeout, allow_redirects=True).ok
        have = self._resumable()
        headers = {"Range": f"bytes={have}-"} if have else {}
        resp = requests.get(url, headers=headers, stream=True, timeout=self.timeout)
        with resp:
            if resp.status_code == 416 and have:  # nothing after byte `have`: complete, or longer than the file
                if have in (self.size, _range_length(resp)):
                    os.replace(self.part, output_file)
                    return None
                length = _range_length(resp)
                self._drop(f"{have:,} bytes, more than the server's file{f' ({length:,} bytes)' if length else ''}")
                return self(url, output_file, pooch_obj)
            if resp.status_code == 200 and have:  # the server ignored the Range: start over
                have = 0
            elif resp.status_code == 206:
                start = int(resp.headers.get("Content-Range", "bytes 0-").split()[1].split("-")[0])
                if start != have:
                    raise DownloadError(f"{url}: asked for bytes from {have}, the server sent from {start}")
            elif not resp.ok:
                raise DownloadError(f"{url}: HTTP {resp.status_code} {resp.reason}")
            remaining = int(resp.headers.get("Content-Length", 0)) or None
            if remaining and self.limit is not None and have + remaining > self.limit:
                raise DownloadError(f"{url}: the server announces {have + remaining:,} bytes, more than {self.what} "
                                    f"with its margin ({self.limit:,}): refused, nothing written"
                                    f"{f' ({self.part} kept as it was)' if have else ''}")
            total = have + remaining if remaining else self.size
            got, over = have, False
            try:
                with open(self.part, "ab" if have else "wb") as fh, \
                        bar(total or 0, desc=self.part.name.removesuffix(".part"), unit="B",
                            unit_scale=True, initial=have) as progress:
                    resp.raw.enforce_content_length = False  # keep the bytes of a cut response; checked below
                    for chunk in resp.raw.stream(CHUNK, decode_content=False):
                        if self.limit is not None and got + len(chunk) > self.limit:
                            over = True  # the file would pass the limit: stop before writing the chunk
                            break
                        fh.write(chunk)
                        got += len(chunk)
                        progress.update(len(chunk))
            except (requests.RequestException, OSError) as err:
                if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise self._disk_full(url, total, err) from err
                raise DownloadError(f"{url}: interrupted at byte {got:,}"
                                    f"{f' of {total:,}' if total else ''} ({type(err).__name__}); "
                                    f"{self.part} is kept and the next call resumes from there") from err
            if over:
                self.part.unlink(missing_ok=True)
                raise DownloadError(f"{url}: the server sent more than {self.what}: stopped at {got:,} bytes (the "
                                    f"limit with its margin: {self.limit:,}) and removed {self.part}, which cannot "
                                    f"be the archive")
            if total and got < total:
                raise DownloadError(f"{url}: the connection closed at byte {got:,} of {total:,}; "
                                    f"{self.part} is kept and the next call resumes from there")
        os.replace(self.part, output_file)  # pooch checks the md5, then moves it into the cache
        return None

    def _resumable(self) -> int:
        """The bytes of the partial file to resume from: 0 when there is none, or after removing one
        longer than the archive can be (over the limit, or over an exact size)."""
        have = self.part.stat().st_size if self.part.exists() else 0
        if self.limit is not None and have > self.limit:
            self._drop(f"{have:,} bytes, more than {self.what} with its margin ({self.limit:,})")
            return 0
        if self.size is not None and have > self.size:
            self._drop(f"{have:,} bytes, more than {self.what}")
            return 0
        return have

    def _drop(self, why: str) -> None:
        print(f"note: {self.part}: {why}; not a partial download of it: removed, downloading from the start",
              file=sys.stderr)
        self.part.unlink(missing_ok=True)

    def _disk_full(self, url: str, total: int | None, err: OSError) -> DownloadError:
        have = self.part.stat().st_size if self.part.exists() else 0
        rest = (f"{total - have:,} more bytes ({_human(total - have)}) are needed" if total
                else "the rest of the file is needed (size unknown)")
        return DownloadError(f"{url}: the disk is full ({os.strerror(err.errno)}) on {self.part.parent} after "
                             f"{have:,} bytes{f' of {total:,}' if total else ''}: {rest}; {self.part} is kept, "
                             f"free some space and run again to resume from there")


def _range_length(resp: requests.Response) -> int | None:
    """The file's length from a 416 answer's `Content-Range: bytes */LENGTH`, if the server sent it."""
    found = re.fullmatch(r"bytes \*/(\d+)", resp.headers.get("Content-Range", "").strip())
    return int(found.group(1)) if found else None


def download_bytes_needed(spec: DatasetSpec, cache: Path) -> int:
    """Bytes the download of spec's archive still writes into `cache` (0 when it is there)."""
    if (cache / spec.archive).is_file():
        return 0
    part = cache / f"{spec.archive}.part"
    return max(0, spec.archive_bytes - (part.stat().st_size if part.exists() else 0))


def fetch(spec: DatasetSpec, cache: Path | None = None, mirror: str | None = None) -> Path:
    """The dataset's archive in the cache: downloaded (or resumed) from spec.url or its mirror
    (mirror_url), after a free-disk check, and md5-verified."""
    cache = Path(cache) if cache else cache_dir()
    url = mirror_url(spec.url, mirror)
    cache.mkdir(parents=True, exist_ok=True)
    part = cache / f"{spec.archive}.part"
    check_disk(cache, download_bytes_needed(spec, cache), f"download {spec.archive}", DownloadError)
    what = (f"the registry's size of {spec.archive} ({spec.archive_bytes:,} bytes"
            f"{', exact' if spec.exact_size else ', approximate'})")
    downloader = ResumableDownloader(part, spec.archive_bytes if spec.exact_size else None, limit=size_limit(spec),
                                     what=what)
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)  # pooch's "Downloading data from ..." line: the progress bar names the file
    try:
        path = pooch.retrieve(url, known_hash=f"md5:{spec.md5}", fname=spec.archive, path=cache,
                              downloader=downloader, progressbar=False)
    except DataError:  # interrupted or refused download: the partial file stays for a resume
        raise
    except ValueError as err:  # pooch: hash mismatch (its temporary file is already deleted)
        part.unlink(missing_ok=True)
        raise DownloadError(f"{url}: checksum mismatch, nothing kept in {cache} ({err})") from err
    except requests.RequestException as err:
        raise DownloadError(f"{url}: {request_failure(err)}; a partial file, if any, is kept in {part}") from err
    finally:
        logger.setLevel(level)
    return Path(path)


def request_failure(err: requests.RequestException) -> str:
    """What went wrong with a request, in a few words ('connection refused', 'timed out', 'Name or
    service not known'), not urllib3's chain of wrapped exceptions with its object addresses."""
    if isinstance(err, requests.Timeout):
        return "timed out"
    cause: BaseException = err
    for _ in range(8):  # requests' error -> urllib3's MaxRetryError -> its .reason (NewConnectionError, ...)
        inner = getattr(cause, "reason", None)
        if not isinstance(inner, BaseException):
            inner = next((a for a in getattr(cause, "args", ()) if isinstance(a, BaseException)), None)
        if inner is None:
            break
        cause = inner
    text = str(cause)
    errno_text = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
    if errno_text:
        what = errno_text.group(1).strip().rstrip(".")
        return f"cannot connect: {what[:1].lower()}{what[1:]}" if isinstance(err, requests.ConnectionError) else what
    text = re.sub(r"<[^>]* object at 0x[0-9a-f]+>: ", "", text)  # urllib3's object reprs
    text = re.sub(r"\w+ConnectionPool\([^)]*\): ", "", text)
    text = " ".join(text.split())
    return f"{type(err).__name__}: {text[:160]}" if text else type(err).__name__


def _members_size(archive: Path) -> int:
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return sum(i.file_size for i in zf.infolist())
        with tarfile.open(archive, "r:*") as tf:
            return sum(m.size for m in tf)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, zlib.error) as err:
        raise DataError(f"{archive}: truncated or corrupt archive ({type(err).__name__}: {err})") from err


def check_disk(folder: Path, needed: int, what: str, error: type[DataError] = DataError) -> None:
    """`error` (with both sizes) when `folder`'s file system has less than needed * 1.05 free."""
    free = shutil.disk_usage(folder).free
    if free < needed * DISK_MARGIN:
        raise error(f"not enough disk to {what}: needs {_human(needed * DISK_MARGIN)} "
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
    tmp = io.temp_dir(dest.parent, dest.name)  # grlib's temporary naming: a killed run's folder is swept
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


def find_files(folder: Path, names: tuple[str, ...], what: str = "the extracted archive") -> list[Path]:
    """Each of `names` somewhere under folder (archives nest them, e.g. KuaiRand-27K/data/);
    DataError listing every name not found, or a name found more than once."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: folder not found ({what})")
    found, missing = [], []
    for name in names:
        hits = sorted(p for p in folder.rglob(name) if p.is_file())
        if len(hits) > 1:
            raise DataError(f"{folder}: {name} found {len(hits)} times ({', '.join(map(str, hits))}); "
                            f"point at a folder that holds one copy")
        (found.append(hits[0]) if hits else missing.append(name))
    if missing:
        raise DataError(f"{folder}: {len(missing)} of the {len(names)} files not found in {what} "
                        f"(searched in subfolders too): {', '.join(missing)}")
    return found


def log_paths(spec: DatasetSpec, cache: Path | None = None, mirror: str | None = None) -> list[Path]:
    """The dataset's log files, downloading (from spec.url or a mirror) and extracting whatever is
    not in the cache yet; the disk must hold both the rest of the download and the extraction."""
    cache = Path(cache) if cache else cache_dir()
    folder = cache / spec.name
    if not folder.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        check_disk(cache, download_bytes_needed(spec, cache) + spec.extracted_bytes,
                   f"download and extract {spec.archive}", DownloadError)
        extract(fetch(spec, cache, mirror), folder, spec.extracted_bytes)
    return find_files(folder, spec.log_files)
