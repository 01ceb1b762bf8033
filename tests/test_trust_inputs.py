"""Hostile inputs of grlib.data stay bounded (issue 55, items 3 and 4).

Files: every line of a raw input (a CSV header or row, MovieLens' u.data) may hold 1 MiB; a longer
one is one DataError naming the file and the line, echoing at most a short escaped excerpt, and a
50 MB line without a newline through `python -m grlib data prepare --raw-dir` keeps the child's
peak RSS under 300 MB (`data prepare` loads no torch; a valid run of it takes about 130-140 MB).
A quote left open is a long line too. Whatever an error message echoes of a file is
truncated and escaped.

Downloads (a local HTTP server on 127.0.0.1): a server that sends more than the registry's size,
with or without Content-Length, writes at most the size plus its margin; the partial file is
removed and the error is one line; a `.part` larger than the size is removed with a note."""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.cli import main
from grlib.data import download, preprocess, registry
from grlib.data.movielens import read_ml100k
from grlib.data.preprocess import prepare_logs, read_log
from grlib.data.registry import DatasetSpec
from grlib.data.synthetic import generate_log
from grlib.schema import LOG_COLUMNS, DataError, shown

HEADER = ",".join(LOG_COLUMNS)
GOOD = "1,10,20220408,900,1649380000000,1,0,0,0,0,0,1,5000,9000,0,0,0,0,1"
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def _good_rows(n: int) -> list[str]:
    """n valid log rows (users 1..7, videos 10..29)."""
    fields = GOOD.split(",")
    return [",".join([str(1 + i % 7), str(10 + i % 20), *fields[2:4], str(1649380000000 + i), *fields[5:]])
            for i in range(n)]


# --- the text helper -------------------------------------------------------------------------------------

def test_shown_escapes_control_bytes_and_says_how_long_the_original_was():
    assert shown("12x") == "12x"
    assert shown("a\x00b\x1b[31mc\td\n\\") == "a\\x00b\\x1b[31mc\\td\\n\\\\"
    assert shown(b"ok\xff\xfe") == "ok\\xff\\xfe"  # not UTF-8: the bytes, escaped
    long = shown("y" * 5000)
    assert long == "y" * 200 + "... (5,000 characters in all)"
    nuls = shown(b"\x00" * 1000, limit=40)  # escaped text counts: 10 NULs fill 40 characters
    assert nuls == "\\x00" * 10 + "... (1,000 bytes in all)"
    assert shown(b"abc", total=52_428_800) == "abc... (52,428,800 bytes in all)"
    assert shown("é中") == "é中"  # printable text is left as it is


# --- files: one line, bounded memory ---------------------------------------------------------------------

# Runs argv[1:] and prints its peak RSS in KiB. A child spawned by this test's process would carry
# the parent's peak (vfork / fork before exec: Linux keeps the larger high-water mark), so the
# command runs as the child of this small wrapper and only its own peak is read.
PEAK_RSS = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")


def _run_prepare(raw: Path, out: Path, tmp_path: Path) -> tuple[int, str, int]:
    """`python -m grlib data prepare --dataset kuairand-pure --raw-dir raw --out out` in a child:
    (exit status, stderr, the child's peak RSS in bytes)."""
    env = {**os.environ, "GRLIB_DATA_DIR": str(tmp_path / "data"), "GRLIB_RESULTS_DIR": str(tmp_path / "results"),
           "GRLIB_PROGRESS": "0"}
    run = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "-m", "grlib", "data", "prepare",
                          "--dataset", "kuairand-pure", "--raw-dir", str(raw), "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True)
    peak_kib = int(run.stdout.decode().split()[-1])
    return run.returncode, run.stderr.decode(errors="replace"), peak_kib * 1024


@pytest.fixture(scope="module")
def prepare_floor(tmp_path_factory) -> int:
    """Peak RSS (bytes) of the same command on a valid raw folder (50 rows a file): the process's
    own footprint (python, polars, pyarrow; no torch), printed beside the hostile file's."""
    tmp_path = tmp_path_factory.mktemp("floor")
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in registry.get("kuairand-pure").log_files:
        (raw / name).write_text("\n".join([HEADER, *_good_rows(50)]) + "\n")
    code, err, peak = _run_prepare(raw, tmp_path / "out", tmp_path)
    assert code == 0, err[-2000:]
    return peak


@pytest.mark.parametrize("layout", ["one line", "header then one line"])
def test_a_50_mb_line_without_newline_is_one_short_error_in_bounded_memory(tmp_path, prepare_floor, layout):
    """KuaiRand-Pure's first standard log is 50 MB without a newline (the second is valid): exit 2,
    one `error:` line naming the file and the line, and the child's peak RSS stays under 300 MB
    (133 MB here; a valid run of the command about as much). Before: 2.8 GB and a 79 MB message."""
    spec = registry.get("kuairand-pure")
    raw = tmp_path / "raw"
    raw.mkdir()
    bad, other = raw / spec.log_files[0], raw / spec.log_files[1]
    body = b"1," * (25 * MiB)  # 50 MiB
    bad.write_bytes(body if layout == "one line" else HEADER.encode() + b"\n" + body)
    other.write_text("\n".join([HEADER, *_good_rows(50)]) + "\n")
    code, err, peak = _run_prepare(raw, tmp_path / "out", tmp_path)
    line = 1 if layout == "one line" else 2
    print(f"{layout}: exit {code}, peak RSS {peak / 1e6:.0f} MB (a valid run: {prepare_floor / 1e6:.0f} MB), "
          f"stderr {len(err):,} characters")
    assert code == 2, err[-2000:]
    assert err.count("\n") == 1 and err.startswith(f"error: {bad}, line {line}:"), err[:500]
    assert len(err) < 400, err[:500]
    assert peak < 300e6, f"peak RSS {peak / 1e6:.0f} MB, a valid run {prepare_floor / 1e6:.0f} MB"
    assert not (tmp_path / "out").exists()


def test_a_10_mb_line_in_the_middle_names_its_line(tmp_path):
    rows = _good_rows(600)
    rows[299] = "7," * (5 * MiB)  # line 301 (the header is line 1): 10 MiB
    path = tmp_path / "log.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    for read in (lambda: prepare_logs([path], tmp_path / "out", max_len=8), lambda: read_log(path)):
        with pytest.raises(DataError) as info:
            read()
        message = str(info.value)
        assert message.startswith(f"{path}, line 301: ") and "1 MiB" in message, message[:500]
        assert len(message) < 400 and "\n" not in message, message[:500]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv"]
    rows[299] = "7," * (MiB // 2 - 1) + "7"  # a line of exactly 1 MiB is still read (then refused as ragged)
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    with pytest.raises(DataError, match=rf"{path.name}, line 301: 524288 fields, the header has 19"):
        prepare_logs([path], tmp_path / "out", max_len=8)


def test_a_header_with_control_bytes_is_escaped(tmp_path, capsys, isolated_outputs):
    spec = registry.get("kuairand-pure")
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / spec.log_files[0]).write_bytes(b"user_id\x00\x1b[2J\x1b]0;owned\x07,video\r_id\x9b,"
                                          + b"z" * 300_000 + b"\n" + GOOD.encode() + b"\n")
    (raw / spec.log_files[1]).write_text("\n".join([HEADER, *_good_rows(5)]) + "\n")
    assert main(["data", "prepare", "--dataset", "kuairand-pure", "--raw-dir", str(raw),
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {raw / spec.log_files[0]}, line 1: missing column")
    assert "user_id\\x00\\x1b[2J\\x1b]0;owned\\x07, video\\r_id" in err, err[:600]
    assert not any(c in err[:-1] for c in "\x00\x1b\x07\r\x9b"), err[:600]
    assert len(err) < 700 and "in all)" in err, err[:700]


def test_a_long_bad_value_is_echoed_truncated(tmp_path):
    fields = GOOD.split(",")
    fields[LOG_COLUMNS.index("video_id")] = "v\x1b" + "9" * 500_000  # a 500 KB line: under the cap, not an id
    path = tmp_path / "log.csv"
    path.write_text("\n".join([HEADER, GOOD, ",".join(fields), GOOD]) + "\n")
    with pytest.raises(DataError) as info:
        prepare_logs([path], tmp_path / "out", max_len=8)
    message = str(info.value)
    assert message.startswith(f"{path}, line 3, column 'video_id': 'v\\x1b999") and "\x1b" not in message
    assert len(message) < 400 and "is not an integer" in message, message[:600]


def test_an_unclosed_quote_is_a_long_line_of_its_own(tmp_path):
    """A quote opens a field that runs on over newlines: polars holds such a record whole (an
    unclosed quote in a 200 MB log: +700 MB), so a record is capped like a line and named by the
    line its quote opened on."""
    rows = _good_rows(40_000)  # 2.6 MB
    rows[5] = '"' + rows[5]  # line 7
    path = tmp_path / "log.csv"
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    with pytest.raises(DataError) as info:
        prepare_logs([path], tmp_path / "out", max_len=8)
    message = str(info.value)
    assert message.startswith(f"{path}, line 7: a quote opened on this line is not closed within 1,048,576 bytes")
    assert len(message) < 400 and "\n" not in message, message[:600]


def test_quoted_fields_that_close_are_read(tmp_path):
    """Quotes that close on their line (a quoted header, quoted numbers, an escaped quote in a
    column outside the schema) pass the record check and are read as before."""
    header = ",".join(f'"{c}"' for c in LOG_COLUMNS) + ',"comment"'
    rows = [",".join(f'"{v}"' for v in row.split(",")) + ',"a ""b"", c"' for row in _good_rows(30)]
    path = tmp_path / "log.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    assert prepare_logs([path], tmp_path / "out", max_len=8)["rows"] == 30


def _first_long(data: bytes, limit: int, quoted: bool) -> int | None:
    """The line number of the first line (quoted: record, ended by a newline after an even count of
    quotes) of `data` longer than `limit` bytes, the plain way."""
    line, start, quotes = 1, 0, 0
    for i, byte in enumerate(data):
        quotes += byte == ord('"')
        if byte == ord("\n") and not (quoted and quotes % 2):
            if i - start > limit:
                return line
            line, start = line + data.count(b"\n", start, i + 1), i + 1
    return line if len(data) - start > limit else None


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.tuples(st.integers(0, 14), st.booleans()), max_size=30),
       read=st.sampled_from([1, 3, 7, 16, 64]), quote_at=st.lists(st.floats(0, 1), max_size=3))
def test_check_lines_finds_the_first_long_line_across_read_boundaries(tmp_path_factory, lines, read, quote_at):
    """check_lines (limit 10 bytes, reads of `read` bytes) agrees with a plain scan: the first line
    over the limit, or with quotes the first record over it, and the line it starts on."""
    data = b"".join(b"x" * n + (b"\n" if nl else b"") for n, nl in lines)
    for share in quote_at:  # a quote in place of a byte (not a newline) at that share of the file
        q = int(share * len(data))
        if q < len(data) and data[q:q + 1] != b"\n":
            data = data[:q] + b'"' + data[q + 1:]
    path = tmp_path_factory.mktemp("lines") / "f.csv"
    path.write_bytes(data)
    expected = _first_long(data, 10, quoted=False) or ('"' in data.decode() and _first_long(data, 10, quoted=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(preprocess, "READ_BYTES", read)
        mp.setattr(preprocess, "RECORD_READ_BYTES", read)
        if not expected:
            preprocess.check_lines(path, limit=10)
            return
        with pytest.raises(DataError, match=rf"f.csv, line {expected}: "):
            preprocess.check_lines(path, limit=10)


def test_a_ml100k_ratings_file_without_newline_is_refused(tmp_path):
    path = tmp_path / "u.data"
    path.write_bytes(b"196\t242\t3\t881250949\n" + b"1\t" * (3 * MiB // 2))
    with pytest.raises(DataError) as info:
        read_ml100k(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line 2: ") and len(message) < 400, message[:600]


# --- downloads: bounded by the registry's size -----------------------------------------------------------

class JunkServer:
    """Serves `size` bytes of junk at any path: without Content-Length (the end is the connection's
    close, or chunked transfer encoding), or with a Content-Length (the true one, or a smaller lie).
    `sent` counts the bytes it managed to write."""

    def __init__(self, size: int, framing: str = "close", declared: int | None = None):
        self.size, self.framing, self.declared, self.sent = size, framing, declared, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1" if framing == "chunked" else "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self.send_response(200)
                if server.framing == "chunked":
                    self.send_header("Transfer-Encoding", "chunked")
                elif server.declared is not None:
                    self.send_header("Content-Length", str(server.declared))
                self.send_header("Connection", "close")
                self.end_headers()
                block = bytes(range(256)) * 256  # 64 KiB
                try:
                    for _ in range(server.size // len(block)):
                        if server.framing == "chunked":
                            self.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n")
                        else:
                            self.wfile.write(block)
                        server.sent += len(block)
                    if server.framing == "chunked":
                        self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
                    pass
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Counted:
    """A file that counts the bytes written through it (into `written`, a one-item list)."""

    def __init__(self, fh, written: list[int]):
        self.fh, self.written = fh, written

    def write(self, data: bytes) -> int:
        self.written[0] += len(data)
        return self.fh.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def _small_spec(exact: bool, size: int = 100_000) -> DatasetSpec:
    return DatasetSpec(name="tiny", url="https://files.invalid/datasets/Tiny.zip", md5="0" * 32, archive="Tiny.zip",
                       archive_bytes=size, exact_size=exact, extracted_bytes=1_000_000, log_files=("u.data",))


@pytest.fixture
def written(monkeypatch) -> list[int]:
    """Bytes the downloader writes into files (download's own `open`)."""
    count = [0]
    monkeypatch.setattr(download, "open", lambda path, mode: _Counted(open(path, mode), count), raising=False)
    return count


@pytest.mark.parametrize("framing", ["close", "chunked"])
@pytest.mark.parametrize("exact", [True, False])
def test_a_mirror_streaming_past_the_size_stops_and_removes_the_part(tmp_path, monkeypatch, capsys, written,
                                                                     framing, exact):
    """42 MB without Content-Length for a 100 KB registry entry: at most 100 KB + 1 MiB (the margin:
    max(1 MiB, 1%) exact, max(1 MiB, 10%) approximate) is written, nothing is left, one line."""
    server = JunkServer(42_000_000, framing)
    try:
        monkeypatch.setitem(registry.DATASETS, "ml-100k", _small_spec(exact))
        cache = tmp_path / "cache"
        assert main(["data", "download", "--dataset", "ml-100k", "--cache", str(cache),
                     "--mirror", f"{server.base}/m"]) == 2
    finally:
        server.close()
    err = capsys.readouterr().err
    print(f"{framing}, exact={exact}: {written[0]:,} bytes written, {server.sent:,} sent")
    assert written[0] <= 100_000 + MiB
    assert list(cache.iterdir()) == []  # no .part, no archive
    assert err.count("\n") == 1 and err.startswith(f"error: {server.base}/m/Tiny.zip: "), err
    assert "more than the registry's size" in err and "removed" in err and len(err) < 400, err


def test_a_content_length_above_the_limit_is_refused_before_writing(tmp_path, monkeypatch, written):
    server = JunkServer(42_000_000, "length", declared=42_000_000)
    try:
        with pytest.raises(download.DownloadError) as info:
            download.fetch(_small_spec(True), tmp_path / "cache", mirror=server.base)
    finally:
        server.close()
    message = str(info.value)
    assert written[0] == 0 and list((tmp_path / "cache").iterdir()) == []
    assert "\n" not in message and "42,000,000" in message and "more than the registry's size" in message, message


@pytest.mark.parametrize("exact", [True, False])
def test_an_oversized_part_is_removed_with_a_note_and_the_download_starts_over(tmp_path, capsys, exact):
    """A `.part` longer than the registry's size (exact), or than its size + 10% + 1 MiB
    (approximate), can never become the file: removed with a note on stderr, the download starts
    from byte 0 and succeeds (before: a Range past the end, HTTP 416, on every call)."""
    payload = _tiny_archive()
    good = _PayloadServer(payload)
    try:
        spec = DatasetSpec(name="tiny", url=good.url, md5=hashlib.md5(payload).hexdigest(), archive="Tiny.tar.gz",
                           archive_bytes=len(payload), exact_size=exact, extracted_bytes=1_000_000,
                           log_files=("x.csv",))
        cache = tmp_path / "cache"
        cache.mkdir()
        junk = 400 if exact else 400 + MiB + len(payload) // 10
        (cache / "Tiny.tar.gz.part").write_bytes(payload + b"j" * junk)
        assert download.fetch(spec, cache).read_bytes() == payload
    finally:
        good.close()
    assert good.ranges == [None]  # asked for the whole file
    err = capsys.readouterr().err
    assert f"{cache / 'Tiny.tar.gz.part'}: {len(payload) + junk:,} bytes" in err and "removed" in err, err
    assert err.count("\n") == 1, err


def test_a_complete_part_of_an_approximate_size_is_finished_not_refused(tmp_path):
    """A `.part` holding the whole file (a run stopped before the rename) of a registry entry with an
    approximate size: the server answers 416 (nothing past the end) with the file's length; the part
    is the file, md5-checked and kept (before: HTTP 416 on every call)."""
    payload = _tiny_archive()
    good = _PayloadServer(payload)
    try:
        spec = DatasetSpec(name="tiny", url=good.url, md5=hashlib.md5(payload).hexdigest(), archive="Tiny.tar.gz",
                           archive_bytes=len(payload) + 5000, exact_size=False, extracted_bytes=1_000_000,
                           log_files=("x.csv",))
        cache = tmp_path / "cache"
        cache.mkdir()
        (cache / "Tiny.tar.gz.part").write_bytes(payload)
        assert download.fetch(spec, cache).read_bytes() == payload
    finally:
        good.close()
    assert good.ranges == [f"bytes={len(payload)}-"]


def _tiny_archive() -> bytes:
    data = generate_log(5, 0.002, 20, seed=1).write_csv().encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("Tiny/x.csv")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class _PayloadServer:
    """One payload at /Tiny.tar.gz with Range support; records the Range headers asked."""

    def __init__(self, payload: bytes):
        self.payload, self.ranges = payload, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.ranges.append(rng)
                start = int(rng.split("=")[1].split("-")[0]) if rng else 0
                if start >= len(server.payload):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(server.payload)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = server.payload[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(server.payload) - 1}/{len(server.payload)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/Tiny.tar.gz"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
