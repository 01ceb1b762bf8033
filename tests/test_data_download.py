"""Download and extraction against a local HTTP server (127.0.0.1, started here; Range support,
optionally cut after N bytes): resume, checksum, truncated archive, disk check, cache variable."""
from __future__ import annotations

import hashlib
import io
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
from grlib.data.schema import DataError
from grlib.data.synthetic import generate_log

LOGS = ("log_standard_a_tiny.csv", "log_standard_b_tiny.csv")


class LocalServer:
    """Serves one payload at /archive.tar.gz; honours `Range: bytes=N-` (unless told not to) and
    can close the connection after `cut_after` bytes of the file while promising all of them."""

    def __init__(self, payload: bytes):
        self.payload, self.cut_after, self.honour_range, self.ranges = payload, None, True, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.ranges.append(rng)
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
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/archive.tar.gz"

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


def _spec(server: LocalServer, md5: str | None = None) -> DatasetSpec:
    return DatasetSpec(name="tiny", url=server.url, md5=md5 or hashlib.md5(server.payload).hexdigest(),
                       archive="Tiny.tar.gz", archive_bytes=len(server.payload), exact_size=True,
                       extracted_bytes=10_000_000, log_files=LOGS)


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
