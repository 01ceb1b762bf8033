"""One preprocessing run in this fresh process (the child of grlib.experiments.data_throughput):

    python -m grlib.probes.preprocess SPEC.json

SPEC: {"method": "streaming" | "in-memory", "csv", "out", "max_len", "bucket_rows", "result"};
writes wall and CPU seconds, the peak RSS (VmHWM) before the work (idle) and after it, rows and
buckets to SPEC["result"] as JSON."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from grlib.probes.rss import peak_rss_mb


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    from grlib.data.preprocess import USED_COLUMNS, prepare_logs, scan_log
    from grlib.data.sequences import build_sequences

    idle = peak_rss_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    csv, out = Path(spec["csv"]), Path(spec["out"])
    if spec["method"] == "streaming":
        stats = prepare_logs([csv], out, max_len=spec["max_len"], bucket_rows=spec["bucket_rows"])
        rows, buckets = stats["rows"], stats["buckets"]
    else:
        log = scan_log(csv, USED_COLUMNS).collect()
        seqs, vocab = build_sequences(log, spec["max_len"])
        out.mkdir(parents=True, exist_ok=True)
        seqs.write_parquet(out / "sequences.parquet")
        vocab.write_parquet(out / "vocab.parquet")
        rows, buckets = log.height, 1
    result = {"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
              "idle_rss_mb": idle, "peak_rss_mb": peak_rss_mb(), "rows": rows, "buckets": buckets}
    Path(spec["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m grlib.probes.preprocess SPEC.json (run `python -m grlib bench data` instead)")
    main(sys.argv[1])
