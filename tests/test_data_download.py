"""Download and extraction against a local HTTP server (127.0.0.1, started here; Range support,
optionally cut after N bytes): resume, checksum, truncated archive, disk checks before a download
and an extraction, disk full mid-download, cache variable, mirror (option and variable), prepare
from a folder of log files (--raw-dir)."""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import socket
import stat
import tarfile
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from grlib.cli import main
from grlib.data import download, registry
from grlib.data.preprocess import prepare_logs
from grlib.data.registry import DatasetSpec
from grlib.schema import DataError
from grlib.data.synthetic import generate_log

LOGS = ("log_standard_a_tiny.csv", "log_standard_b_tiny.csv")


class LocalServer:
    """Serves one payload at /archive.tar.gz; honours `Range: bytes=N-` (unless told not to) and
    can close the connection after `cut_after` bytes of the file while promising all of them."""

    def __init__(self, payload: bytes):
        self.payload, self.cut_after, self.honour_range, self.ranges, self.paths = payload, None, True, [], []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.ranges.append(rng)
                server.paths.append(self.path)
                start = int(rng.split("=")[1].split("-")[0]) if rng and server.honour_range else 0
                body = server.payload[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(server.payload) - 1}/{len(server.payload)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if server.cut_after is not None:
                    body = body[:max(0, server.cut_after - start)]
                self.wfile.write(body)
                self.wfile.flush()
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def url(self) -> str:
        return f"{self.base}/archive.tar.gz"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _archive() -> bytes:
    """A small tar.gz laid out like KuaiRand's: Tiny/data/<two standard logs>."""
    log = generate_log(30, 0.005, 200, seed=3)
    halves = (log.filter(log["time_ms"] < log["time_ms"].median()), log.filter(log["time_ms"] >= log["time_ms"].median()))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, part in zip(LOGS, halves):
            data = part.write_csv().encode()
            info = tarfile.TarInfo(f"Tiny/data/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def payload() -> bytes:
    return _archive()


@pytest.fixture
def server(payload):
    srv = LocalServer(payload)
    yield srv
    srv.close()


def _spec(server: LocalServer, md5: str | None = None, url: str | None = None) -> DatasetSpec:
    return DatasetSpec(name="tiny", url=url or server.url, md5=md5 or hashlib.md5(server.payload).hexdigest(),
                       archive="Tiny.tar.gz", archive_bytes=len(server.payload), exact_size=True,
                       extracted_bytes=10_000_000, log_files=LOGS)


UNREACHABLE = "https://zenodo.invalid/records/1/files/Tiny.tar.gz"  # .invalid never resolves


def test_cut_download_resumes_from_the_byte_it_had(server, tmp_path):
    spec, cache = _spec(server), tmp_path / "cache"
    cut = len(server.payload) // 3
    server.cut_after = cut
    with pytest.raises(download.DownloadError, match=f"byte {cut:,}.*resumes"):
        download.fetch(spec, cache)
    part = cache / "Tiny.tar.gz.part"
    assert part.stat().st_size == cut and not (cache / "Tiny.tar.gz").exists()

    server.cut_after = None
    path = download.fetch(spec, cache)
    assert server.ranges[-1] == f"bytes={cut}-"  # asked only for the missing bytes
    assert path.read_bytes() == server.payload and not part.exists()
    assert sorted(p.name for p in cache.iterdir()) == ["Tiny.tar.gz"]

    download.fetch(spec, cache)  # in the cache and verified: no new request
    assert len(server.ranges) == 2


def test_resume_restarts_when_the_server_ignores_range(server, tmp_path):
    spec, cache = _spec(server), tmp_path / "cache"
    server.cut_after = 100
    with pytest.raises(download.DownloadError):
        download.fetch(spec, cache)
    server.cut_after, server.honour_range = None, False
    assert download.fetch(spec, cache).read_bytes() == server.payload


def test_checksum_mismatch_leaves_nothing_in_the_cache(server, tmp_path):
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="(?i)md5|hash|checksum"):
        download.fetch(_spec(server, md5="0" * 32), cache)
    assert list(cache.iterdir()) == []


def test_truncated_archive_is_refused_and_nothing_extracted(payload, tmp_path):
    archive = tmp_path / "Tiny.tar.gz"
    archive.write_bytes(payload[: len(payload) // 2])
    with pytest.raises(DataError, match="Tiny.tar.gz: truncated or corrupt archive"):
        download.extract(archive, tmp_path / "tiny", needed=1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Tiny.tar.gz"]


def test_not_enough_disk_is_refused_before_extracting(payload, tmp_path, monkeypatch):
    archive = tmp_path / "Tiny.tar.gz"
    archive.write_bytes(payload)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(download.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 5000, 5000))
    with pytest.raises(DataError, match=r"not enough disk to extract Tiny.tar.gz: needs .*\(46,000,000,000 bytes "
                                        r"\+ 5%\), 5.0 KB \(5,000 bytes\) free"):
        download.extract(archive, tmp_path / "tiny", needed=46_000_000_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Tiny.tar.gz"]


def test_cache_variable_download_extract_and_prepare(server, tmp_path, monkeypatch):
    monkeypatch.setenv("GRLIB_CACHE_DIR", str(tmp_path / "moved-cache"))
    spec = _spec(server)
    logs = download.log_paths(spec)
    assert [p.name for p in logs] == list(LOGS)
    assert all(p.is_relative_to(tmp_path / "moved-cache" / "tiny") for p in logs)
    stats = prepare_logs(logs, tmp_path / "out", max_len=16)
    assert stats["rows"] == sum(len(p.read_text().splitlines()) - 1 for p in logs)
    assert download.log_paths(spec) == logs and len(server.ranges) == 1  # cached, extracted once


def test_cli_download_prints_the_log_files(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(registry.DATASETS, "kuairand-pure", _spec(server))
    assert main(["data", "download", "--dataset", "kuairand-pure", "--cache", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out.split()
    assert [Path(p).name for p in printed] == list(LOGS)


def test_registry_holds_the_published_facts():
    spec = registry.get("kuairand-27k")
    assert (spec.md5, spec.archive_bytes, spec.interactions) == (
        "3e3c799a24e2d23a4d2c757fbf9adf59", 9_892_191_178, 322_278_385)
    assert spec.url == "https://zenodo.org/records/10439422/files/KuaiRand-27K.tar.gz"
    assert len(spec.log_files) == 4
    with pytest.raises(KeyError, match="registered: kuairand-pure"):
        registry.get("kuairand-2k")


def test_mirror_option_replaces_the_base_keeps_the_file_name_and_wins_over_the_variable(server, tmp_path,
                                                                                       monkeypatch):
    spec = _spec(server, url=UNREACHABLE)
    monkeypatch.setenv("GRLIB_MIRROR", "http://127.0.0.1:9/not-this-one")
    path = download.fetch(spec, tmp_path / "cache", mirror=f"{server.base}/mirror/kuairand/")
    assert path.read_bytes() == server.payload and server.paths == ["/mirror/kuairand/Tiny.tar.gz"]


def test_mirror_variable_and_the_cli_option(server, tmp_path, monkeypatch, capsys):
    spec = _spec(server, url=UNREACHABLE)
    monkeypatch.setenv("GRLIB_MIRROR", f"{server.base}/from-env")
    assert [p.name for p in download.log_paths(spec, tmp_path / "a")] == list(LOGS)
    monkeypatch.delenv("GRLIB_MIRROR")
    monkeypatch.setitem(registry.DATASETS, "kuairand-pure", spec)
    assert main(["data", "download", "--dataset", "kuairand-pure", "--cache", str(tmp_path / "b"),
                 "--mirror", f"{server.base}/from-cli"]) == 0
    assert [Path(p).name for p in capsys.readouterr().out.split()] == list(LOGS)
    assert server.paths == ["/from-env/Tiny.tar.gz", "/from-cli/Tiny.tar.gz"]


def test_a_mirror_is_md5_checked_and_a_bad_mirror_url_is_named(server, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    with pytest.raises(download.DownloadError, match=rf"{server.base}/m/Tiny.tar.gz: checksum mismatch"):
        download.fetch(_spec(server, md5="0" * 32, url=UNREACHABLE), cache, mirror=f"{server.base}/m")
    assert list(cache.iterdir()) == []
    with pytest.raises(download.DownloadError, match=r"--mirror 'ftp://host/x': not an http\(s\) URL"):
        download.fetch(_spec(server), cache, mirror="ftp://host/x")
    monkeypatch.setenv("GRLIB_MIRROR", "mirror.example/kuairand")
    with pytest.raises(download.DownloadError, match=r"GRLIB_MIRROR 'mirror.example/kuairand': not an http"):
        download.fetch(_spec(server), cache)
    assert server.paths == ["/m/Tiny.tar.gz"]  # the bad URLs asked nothing of anyone


def _usage(free: int):
    usage = namedtuple("usage", "total used free")
    return lambda path: usage(10**12, 10**12 - free, free)


def test_free_disk_is_checked_before_a_download_less_the_partial_file(server, tmp_path, monkeypatch, capsys):
    spec, cache = _spec(server), tmp_path / "cache"
    cache.mkdir()
    part = cache / "Tiny.tar.gz.part"
    part.write_bytes(server.payload[:8000])  # an interrupted download: 8,000 bytes already there
    rest = len(server.payload) - 8000
    monkeypatch.setattr(download.shutil, "disk_usage", _usage(rest))  # the rest fits, the 5% margin does not
    monkeypatch.setitem(registry.DATASETS, "kuairand-pure", spec)
    assert main(["data", "download", "--dataset", "kuairand-pure", "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(
        rf"error: not enough disk to download and extract Tiny.tar.gz: needs .* \({rest + 10_000_000:,} bytes "
        rf"\+ 5%\), .* \({rest:,} bytes\) free on {cache}", err)
    with pytest.raises(download.DownloadError, match=rf"not enough disk to download Tiny.tar.gz: needs .* "
                       rf"\({rest:,} bytes \+ 5%\), .* \({rest:,} bytes\) free on {cache}"):
        download.fetch(spec, cache)
    assert server.ranges == [] and part.read_bytes() == server.payload[:8000]  # nothing asked, nothing lost

    monkeypatch.setattr(download.shutil, "disk_usage", _usage(int(rest * 1.06)))  # < the whole archive + 5%
    assert download.fetch(spec, cache).read_bytes() == server.payload
    assert server.ranges == ["bytes=8000-"]


class _FillsUp:
    """A file that takes `room` bytes, then fails like a full disk (ENOSPC)."""

    def __init__(self, fh, room: int):
        self.fh, self.room = fh, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.fh.write(data[:self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.fh.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def test_disk_full_mid_download_says_so_and_the_next_call_resumes(server, tmp_path, monkeypatch):
    spec, cache = _spec(server), tmp_path / "cache"
    room, total = 12_345, len(server.payload)
    monkeypatch.setattr(download, "open", lambda path, mode: _FillsUp(open(path, mode), room), raising=False)
    with pytest.raises(download.DownloadError) as info:
        download.fetch(spec, cache)
    message = str(info.value)
    assert "\n" not in message and re.search(
        rf"the disk is full \(No space left on device\) on {cache} after {room:,} bytes of {total:,}: "
        rf"{total - room:,} more bytes \(.*\) are needed; {cache / 'Tiny.tar.gz.part'} is kept, free some "
        rf"space and run again to resume", message)
    assert (cache / "Tiny.tar.gz.part").read_bytes() == server.payload[:room]

    monkeypatch.delattr(download, "open")
    assert download.fetch(spec, cache).read_bytes() == server.payload
    assert server.ranges[-1] == f"bytes={room}-"


def _raw_folder(payload: bytes, folder: Path) -> Path:
    """The archive's logs, unpacked somewhere below `folder` (as a user might have them)."""
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as tf:
        tf.extractall(folder / "downloads" / "kuairand", filter="data")
    return folder


def test_prepare_reads_the_log_files_from_any_folder(server, payload, tmp_path, monkeypatch, capsys,
                                                     isolated_outputs):
    monkeypatch.setitem(registry.DATASETS, "kuairand-pure", _spec(server, url=UNREACHABLE))
    raw = _raw_folder(payload, tmp_path / "mine")
    out = tmp_path / "seqs"
    args = ["data", "prepare", "--dataset", "kuairand-pure", "--out", str(out), "--max-len", "16"]
    assert main([*args, "--raw-dir", str(raw)]) == 0
    stats = json.loads(capsys.readouterr().out)
    logs = sorted(raw.rglob("log_standard_*_tiny.csv"))
    assert stats["rows"] == sum(len(p.read_text().splitlines()) - 1 for p in logs)
    assert stats["dataset"] == "kuairand-pure"
    assert server.ranges == []  # nothing downloaded

    logs[1].unlink()
    assert main([*args, "--raw-dir", str(raw)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"error: {raw}: 1 of the 2 files not found in the raw folder of tiny (searched in subfolders too): "
        f"{LOGS[1]}") in err
    assert main([*args, "--raw-dir", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'}: folder not found" in capsys.readouterr().err
    (raw / "copy").mkdir()
    (raw / "copy" / LOGS[0]).write_text(logs[0].read_text())
    assert main([*args, "--raw-dir", str(raw)]) == 2
    assert f"{LOGS[0]} found 2 times" in capsys.readouterr().err


def test_extracted_folders_honour_the_umask(payload, tmp_path):
    archive = tmp_path / "Tiny.tar.gz"
    archive.write_bytes(payload)
    old = os.umask(0o027)
    try:
        dest = download.extract(archive, tmp_path / "tiny", needed=1000)
    finally:
        os.umask(old)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o750


def test_a_failed_connection_is_one_short_line(server, tmp_path, monkeypatch, capsys):
    """Nothing listens on the mirror's port: one line naming the URL and the cause, not urllib3's
    exception chain, and no 'Downloading data from' line of pooch before it. The port is held by a
    socket bound but not listening (a connection to it is refused), so that no other process of a
    parallel run can take it up between the choice of the port and the request."""
    monkeypatch.setitem(registry.DATASETS, "kuairand-pure", _spec(server, url=UNREACHABLE))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{held.getsockname()[1]}"
        assert main(["data", "download", "--dataset", "kuairand-pure", "--cache", str(tmp_path / "c"),
                     "--mirror", f"{base}/m"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.count("\n") == 1, got.err
    assert got.err.startswith(f"error: {base}/m/Tiny.tar.gz: cannot connect: connection refused; "), got.err
    part = tmp_path / "c" / "Tiny.tar.gz.part"  # (its length is the machine's: pytest's folder, xdist's worker)
    assert got.err.endswith(f"; a partial file, if any, is kept in {part}\n"), got.err
    assert len(got.err) - len(str(part)) < 160, got.err
    assert not re.search(r"ConnectionPool|Max retries|object at 0x|Downloading", got.err)
