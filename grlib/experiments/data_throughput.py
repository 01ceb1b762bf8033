"""Preprocessing throughput and peak memory (`bench data`): synthetic KuaiRand-shaped CSV -> sequences.

For each of `rows` N a synthetic log of about N rows (length factor 1.0: KuaiRand-27K's per-user
lengths) is written as CSV; then, each in a fresh child process (grlib.probes.preprocess), the
streaming preprocessing (grlib.data.preprocess) and the baseline of the same run, everything in
memory (build_sequences on the whole log), turn it into sequences. Per method: wall and CPU
seconds, rows/s, and the child's own peak RSS (VmHWM), including the interpreter and its imports
(idle_rss_mb). A last row extrapolates the streaming figures of the largest N to KuaiRand-27K
(322,278,385 rows, 32,038,725 videos).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KUAIRAND_27K_ROWS, KUAIRAND_27K_VIDEOS = 322_278_385, 32_038_725
VOCAB_BYTES_PER_VIDEO = 28  # count array 8 + lookup 4 + vocab frame (video_id 8, count 4, item_id 4)


@dataclasses.dataclass(frozen=True)
class Options:
    """Log rows (one run per value), the synthetic log's length factor, catalogue size (the same for
    every N) and seed, the preprocessing's max_len and bucket_rows, whether to skip the in-memory
    baseline, and where the CSV and outputs go (None: the system's temp)."""

    rows: list[int] = dataclasses.field(default_factory=lambda: [5_000_000])
    length_factor: float = 1.0
    n_items: int = 1_000_000
    max_len: int = 4096
    bucket_rows: int = 2_000_000
    seed: int = 0
    no_baseline: bool = False
    workdir: str | None = None


def users_for_rows(rows: int, length_factor: float, seed: int) -> int:
    """Users whose synthetic log has about `rows` rows (mean length from a large draw)."""
    from grlib.data.synthetic import expected_rows

    mean = expected_rows(20_000, length_factor, seed) / 20_000
    return max(1, round(rows / mean))


def measure_one(method: str, csv: Path, work: Path, max_len: int, bucket_rows: int) -> dict:
    """One preprocessing run in a fresh child process, which reports its own peak RSS."""
    out, spec_path, result = work / f"out-{method}", work / f"spec-{method}.json", work / f"result-{method}.json"
    spec_path.write_text(json.dumps({"method": method, "csv": str(csv), "out": str(out), "max_len": max_len,
                                     "bucket_rows": bucket_rows, "result": str(result)}))
    code = subprocess.call([sys.executable, "-m", "grlib.probes.preprocess", str(spec_path)])
    if code != 0:
        raise RuntimeError(f"bench data: the {method} child failed (exit {code})")
    res = json.loads(result.read_text())
    shutil.rmtree(out, ignore_errors=True)
    return res


def measure(opt: Options) -> tuple[list[dict], str]:
    """The rows (table bench_data) and the table's title."""
    from grlib.data.preprocess import PART_BYTES_PER_ROW
    from grlib.data.synthetic import write_log_csv

    rows_out = []
    for target_rows in opt.rows:
        work = Path(tempfile.mkdtemp(dir=opt.workdir, prefix="grlib-bench-data-"))
        try:
            users = users_for_rows(target_rows, opt.length_factor, opt.seed)
            csv = work / "log.csv"
            t0 = time.perf_counter()
            n = write_log_csv(csv, users, opt.length_factor, opt.n_items, opt.seed)
            gen_s = time.perf_counter() - t0
            methods = ["streaming"] + ([] if opt.no_baseline else ["in-memory"])
            for method in methods:
                m = measure_one(method, csv, work, opt.max_len, opt.bucket_rows)
                rows_out.append({
                    "method": method, "rows": n, "users": users, "csv_mb": csv.stat().st_size / 1e6,
                    "buckets": m["buckets"], "seconds": m["seconds"], "rows_per_s": n / m["seconds"],
                    "cpu_s": m["cpu_s"], "rows_per_cpu_s": n / m["cpu_s"], "peak_rss_mb": m["peak_rss_mb"],
                    "idle_rss_mb": m["idle_rss_mb"], "generate_s": gen_s, "n_items": opt.n_items,
                    "max_len": opt.max_len, "bucket_rows": opt.bucket_rows})
        finally:
            shutil.rmtree(work, ignore_errors=True)
    stream = [r for r in rows_out if r["method"] == "streaming"]
    base = {r["rows"]: r for r in rows_out if r["method"] == "in-memory"}
    smallest = min(stream, key=lambda r: r["rows"])
    for method in {r["method"] for r in rows_out}:
        runs = [r for r in rows_out if r["method"] == method]
        first = min(runs, key=lambda r: r["rows"])
        for r in runs:
            r["rss_vs_smallest_run"] = r["peak_rss_mb"] / first["peak_rss_mb"]
    for r in rows_out:
        b = base.get(r["rows"])
        r["speed_vs_in_memory"] = (r["rows_per_s"] / b["rows_per_s"]) if b else float("nan")
        r["rss_vs_in_memory"] = (r["peak_rss_mb"] / b["peak_rss_mb"]) if b else float("nan")
    largest = max(stream, key=lambda r: r["rows"])
    vocab_mb = (KUAIRAND_27K_VIDEOS - opt.n_items) * VOCAB_BYTES_PER_VIDEO / 1e6
    rows_out.append({
        "method": "streaming, extrapolated to KuaiRand-27K", "rows": KUAIRAND_27K_ROWS,
        "seconds": KUAIRAND_27K_ROWS / largest["rows_per_s"], "rows_per_s": largest["rows_per_s"],
        "cpu_s": KUAIRAND_27K_ROWS / largest["rows_per_cpu_s"], "rows_per_cpu_s": largest["rows_per_cpu_s"],
        "peak_rss_mb": largest["peak_rss_mb"] + max(vocab_mb, 0.0),
        "temp_disk_gb": KUAIRAND_27K_ROWS * PART_BYTES_PER_ROW / 1e9,
        "rss_vs_smallest_run": float("nan"), "speed_vs_in_memory": float("nan"), "rss_vs_in_memory": float("nan"),
        "bucket_rows": opt.bucket_rows, "max_len": opt.max_len, "n_items": KUAIRAND_27K_VIDEOS})
    title = (f"bench data: CSV -> sequences, length factor {opt.length_factor}, {opt.n_items:,} videos, "
             f"max_len {opt.max_len}, bucket_rows {opt.bucket_rows:,}; streaming flat-RSS ratio "
             f"{largest['peak_rss_mb'] / smallest['peak_rss_mb']:.2f} ({smallest['rows']:,} -> "
             f"{largest['rows']:,} rows); 27K extrapolation: "
             f"{KUAIRAND_27K_ROWS / largest['rows_per_s'] / 60:.0f} min, "
             f"{(largest['peak_rss_mb'] + max(vocab_mb, 0.0)) / 1e3:.1f} GB peak RSS\n"
             f"vs_mem: against the in-memory baseline of the same rows (speed, peak RSS)")
    return rows_out, title
