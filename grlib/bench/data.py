"""Preprocessing throughput and peak memory: synthetic KuaiRand-shaped CSV -> sequences.

For each --rows N a synthetic log of about N rows (length factor 1.0: KuaiRand-27K's per-user
lengths) is written as CSV; then, each in a fresh child process, the streaming preprocessing
(grlib.data.preprocess) and the baseline of the same run, everything in memory
(build_sequences on the whole log), turn it into sequences. Per method: wall and CPU seconds,
rows/s, and the child's own peak RSS (VmHWM), including the interpreter and its imports (idle_rss_mb).
A last row extrapolates the streaming figures of the largest N to KuaiRand-27K (322,278,385 rows,
32,038,725 videos). Rows go to results/tables/bench_data.parquet.

--rank-share: the data memory of the ranks of a data-parallel run, per rank, at --world P = 1, 2, 4
on one synthetic twin (prepared once, --share-users users at --share-length-factor, cut to
--share-max-len). Each rank runs in a fresh child, one after the other (a rank's data path does not
communicate: the Planner is deterministic and the fingerprint all-gather is the step's): it loads
the data, then plans --steps global batches as a rank of P (assignment, negatives, its sub-batch),
then reads one validation pass. Two loaders, in the same run: "whole" (SequenceData.load: every
rank reads the whole table, the baseline) and "share" (grlib.data.share: flat files read per batch,
global batches known by their lengths). Per rank: VmRSS before loading (after the imports), the
peak (VmHWM) after the steps and after the validation pass: data_rss_train_mb and data_rss_mb = peak -
before (the validation pass holds an eval batch, train.eval_batch_size windows and histories); the plans'
checksum (fingerprints and local token sums), which must be the same for both loaders. Rows go to
bench_data with method "rank-share".
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grlib import results
from grlib.bench.common import positive_int, print_table
from grlib.config import config_from_args

KUAIRAND_27K_ROWS, KUAIRAND_27K_VIDEOS = 322_278_385, 32_038_725
VOCAB_BYTES_PER_VIDEO = 28  # count array 8 + lookup 4 + vocab frame (video_id 8, count 4, item_id 4)


# the columns the table prints (key, or (key, header)); every other one is in the rows (--wide, --json)
COLUMNS = ("method", "rows", "seconds", "rows_per_s", "peak_rss_mb", ("speed_vs_in_memory", "speed_vs_mem"),
           ("rss_vs_in_memory", "rss_vs_mem"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, nargs="+", default=[5_000_000], help="log rows (one run per value)")
    p.add_argument("--length-factor", type=float, default=1.0)
    p.add_argument("--n-items", type=int, default=1_000_000, help="catalogue size (the same for every N)")
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--bucket-rows", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-baseline", action="store_true", help="skip the in-memory baseline")
    p.add_argument("--workdir", default=None, help="where the CSV and outputs go (default: system temp)")
    p.add_argument("--rank-share", action="store_true",
                   help="measure the data RSS per rank of a data-parallel run instead (module docstring)")
    p.add_argument("--world", type=positive_int, nargs="+", default=[1, 2, 4], help="--rank-share: ranks P")
    p.add_argument("--share-users", type=positive_int, default=2000, help="--rank-share: users of the twin")
    p.add_argument("--share-length-factor", type=float, default=0.5, help="--rank-share: the twin's length factor")
    p.add_argument("--share-max-len", type=positive_int, default=4096, help="--rank-share: data.max_len")
    p.add_argument("--batch-size", type=positive_int, default=16, help="--rank-share: sequences per global batch")
    p.add_argument("--steps", type=int, default=0, help="--rank-share: global batches planned (0: one epoch)")


def users_for_rows(rows: int, length_factor: float, seed: int) -> int:
    """Users whose synthetic log has about `rows` rows (mean length from a large draw)."""
    from grlib.data.synthetic import expected_rows

    mean = expected_rows(20_000, length_factor, seed) / 20_000
    return max(1, round(rows / mean))


def peak_rss_mb() -> float:
    """This process's peak resident set size since it started its program (Linux: VmHWM of
    /proc/self/status). ru_maxrss would also count the parent's RSS at fork time (Linux keeps
    the larger of the two across exec), which is why the parent does not use it."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # other systems: an upper bound


def _child(spec_path: str) -> None:
    """Runs one preprocessing in this (fresh) process; writes timings and peak RSS to spec['result']."""
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


def measure(method: str, csv: Path, work: Path, max_len: int, bucket_rows: int) -> dict:
    """One preprocessing run in a fresh child process, which reports its own peak RSS."""
    out, spec_path, result = work / f"out-{method}", work / f"spec-{method}.json", work / f"result-{method}.json"
    spec_path.write_text(json.dumps({"method": method, "csv": str(csv), "out": str(out), "max_len": max_len,
                                     "bucket_rows": bucket_rows, "result": str(result)}))
    code = subprocess.call([sys.executable, "-m", "grlib.bench.data", "--child", str(spec_path)])
    if code != 0:
        raise RuntimeError(f"bench data: the {method} child failed (exit {code})")
    res = json.loads(result.read_text())
    shutil.rmtree(out, ignore_errors=True)
    return res


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.data.preprocess import PART_BYTES_PER_ROW
    from grlib.data.synthetic import write_log_csv

    if args.rank_share:
        return run_share(args)
    cfg = config_from_args(args)
    rows_out = []
    for target_rows in args.rows:
        work = Path(tempfile.mkdtemp(dir=args.workdir, prefix="grlib-bench-data-"))
        try:
            users = users_for_rows(target_rows, args.length_factor, args.seed)
            csv = work / "log.csv"
            t0 = time.perf_counter()
            n = write_log_csv(csv, users, args.length_factor, args.n_items, args.seed)
            gen_s = time.perf_counter() - t0
            methods = ["streaming"] + ([] if args.no_baseline else ["in-memory"])
            for method in methods:
                m = measure(method, csv, work, args.max_len, args.bucket_rows)
                rows_out.append({
                    "method": method, "rows": n, "users": users, "csv_mb": csv.stat().st_size / 1e6,
                    "buckets": m["buckets"], "seconds": m["seconds"], "rows_per_s": n / m["seconds"],
                    "cpu_s": m["cpu_s"], "rows_per_cpu_s": n / m["cpu_s"], "peak_rss_mb": m["peak_rss_mb"],
                    "idle_rss_mb": m["idle_rss_mb"], "generate_s": gen_s, "n_items": args.n_items,
                    "max_len": args.max_len, "bucket_rows": args.bucket_rows})
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
    vocab_mb = (KUAIRAND_27K_VIDEOS - args.n_items) * VOCAB_BYTES_PER_VIDEO / 1e6
    rows_out.append({
        "method": "streaming, extrapolated to KuaiRand-27K", "rows": KUAIRAND_27K_ROWS,
        "seconds": KUAIRAND_27K_ROWS / largest["rows_per_s"], "rows_per_s": largest["rows_per_s"],
        "cpu_s": KUAIRAND_27K_ROWS / largest["rows_per_cpu_s"], "rows_per_cpu_s": largest["rows_per_cpu_s"],
        "peak_rss_mb": largest["peak_rss_mb"] + max(vocab_mb, 0.0),
        "temp_disk_gb": KUAIRAND_27K_ROWS * PART_BYTES_PER_ROW / 1e9,
        "rss_vs_smallest_run": float("nan"), "speed_vs_in_memory": float("nan"), "rss_vs_in_memory": float("nan"),
        "bucket_rows": args.bucket_rows, "max_len": args.max_len, "n_items": KUAIRAND_27K_VIDEOS})
    print_table(rows_out,
                f"bench data: CSV -> sequences, length factor {args.length_factor}, {args.n_items:,} videos, "
                f"max_len {args.max_len}, bucket_rows {args.bucket_rows:,}; streaming flat-RSS ratio "
                f"{largest['peak_rss_mb'] / smallest['peak_rss_mb']:.2f} ({smallest['rows']:,} -> "
                f"{largest['rows']:,} rows); 27K extrapolation: "
                f"{KUAIRAND_27K_ROWS / largest['rows_per_s'] / 60:.0f} min, "
                f"{(largest['peak_rss_mb'] + max(vocab_mb, 0.0)) / 1e3:.1f} GB peak RSS\n"
                f"vs_mem: against the in-memory baseline of the same rows (speed, peak RSS)", COLUMNS)
    results.append_rows("bench_data", rows_out, cfg)
    return rows_out


def status_mb(field: str) -> float:
    """A field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field} (Linux only)")


def _share_child(spec_path: str) -> None:
    """One rank's data path (run_share) in this fresh process; writes its figures to spec['result']."""
    spec = json.loads(Path(spec_path).read_text())
    import numpy as np

    from grlib.config import load_config
    from grlib.data.sequences import SequenceData
    from grlib.data.share import MappedSequences
    from grlib.distributed.data_parallel import Planner
    from grlib.negatives import build_negative_path

    cfg = load_config(spec["scale"], spec["overrides"])
    before = status_mb("VmRSS")
    t0 = time.perf_counter()
    data = (SequenceData.load(Path(spec["folder"])) if spec["loader"] == "whole"
            else MappedSequences(Path(spec["arrays"]), global_batches=True))
    path = build_negative_path(cfg.negatives, data.n_items, data.train_item_counts(), seed=cfg.train.seed)
    planner = Planner(path, spec["rank"], spec["world"], "lpt", seed=cfg.train.seed)
    load_s, t1 = time.perf_counter() - t0, time.perf_counter()
    steps = spec["steps"] or data.n_train_batches(spec["batch_size"])
    check, done = 0, 0
    for batch in data.train_batches(spec["batch_size"], cfg.data.max_len, np.random.default_rng(cfg.train.seed)):
        if done == steps:
            break
        plan = planner(batch)
        check = (check * 1_000_003 + int(plan.fingerprint.sum()) + int(plan.local.item_ids.sum())
                 + int(plan.local.targets.sum()) + int(plan.token_index.sum())) % (2**61 - 1)
        done += 1
    steps_s, hwm_train = time.perf_counter() - t1, status_mb("VmHWM")
    for batch in data.eval_batches("val", cfg.train.eval_batch_size, cfg.data.max_len):
        check = (check * 1_000_003 + int(batch.item_ids.sum()) + int(batch.eval_targets.sum())) % (2**61 - 1)
    result = {"before_mb": before, "hwm_train_mb": hwm_train, "hwm_eval_mb": status_mb("VmHWM"),
              "rss_end_mb": status_mb("VmRSS"), "load_s": load_s, "steps_s": steps_s, "steps": done,
              "checksum": check}
    Path(spec["result"]).write_text(json.dumps(result))


def run_share(args: argparse.Namespace) -> list[dict]:
    """--rank-share (module docstring): whole vs share, per rank, at each --world."""
    from grlib.data.catalog import ensure_prepared
    from grlib.data.share import ensure_arrays

    overrides = {"data.dataset": "synthetic", "data.n_users": args.share_users,
                 "data.length_factor": args.share_length_factor, "data.max_len": args.share_max_len}
    cfg = config_from_args(args, overrides)
    folder = ensure_prepared(cfg)
    arrays = ensure_arrays(folder)
    stats = json.loads((folder / "stats.json").read_text())
    events = stats["events"]
    whole_mb = events * 25 / 2**20  # int64 items, actions, timestamps + bool is_target per event
    rows_out = []
    work = Path(tempfile.mkdtemp(dir=args.workdir, prefix="grlib-bench-share-"))
    try:
        for world in args.world:
            for loader in ("whole", "share"):
                for rank in range(world):
                    spec_path, result = work / "spec.json", work / f"result-{loader}-{world}-{rank}.json"
                    spec_path.write_text(json.dumps({
                        "loader": loader, "rank": rank, "world": world, "scale": cfg.scale,
                        "overrides": {**dict(_override_items(args)), **overrides}, "folder": str(folder),
                        "arrays": str(arrays), "steps": args.steps, "batch_size": args.batch_size,
                        "result": str(result)}))
                    code = subprocess.call([sys.executable, "-m", "grlib.bench.data", "--share-child", str(spec_path)])
                    if code != 0:
                        raise RuntimeError(f"bench data --rank-share: the {loader} child of rank {rank} of {world} "
                                           f"failed (exit {code})")
                    m = json.loads(result.read_text())
                    rows_out.append({"method": "rank-share", "loader": loader, "world": world, "rank": rank,
                                     "users": stats["users"], "events": events, "data_in_memory_mb": whole_mb,
                                     "max_len": args.share_max_len, "batch_size": args.batch_size,
                                     "before_mb": m["before_mb"], "rss_end_mb": m["rss_end_mb"],
                                     "data_rss_train_mb": m["hwm_train_mb"] - m["before_mb"],
                                     "data_rss_mb": m["hwm_eval_mb"] - m["before_mb"],
                                     "load_s": m["load_s"], "steps": m["steps"], "steps_s": m["steps_s"],
                                     "checksum": str(m["checksum"])})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _share_summary(rows_out, args, cfg)


def _override_items(args: argparse.Namespace):
    from grlib.config import parse_overrides

    return parse_overrides(args.override).items()


def _share_summary(rows_out: list[dict], args: argparse.Namespace, cfg) -> list[dict]:
    """Per (loader, world): the largest data RSS over the ranks; ratios to the whole read at P = 1;
    the plans of both loaders must match rank by rank."""
    from grlib.manifest import hardware

    key = lambda r: (r["world"], r["rank"])  # noqa: E731
    whole = {key(r): r for r in rows_out if r["loader"] == "whole"}
    for r in rows_out:
        r["plans_equal_whole"] = r["checksum"] == whole[key(r)]["checksum"]
    if not all(r["plans_equal_whole"] for r in rows_out):
        bad = [key(r) for r in rows_out if not r["plans_equal_whole"]]
        raise RuntimeError(f"bench data --rank-share: the share loader planned other batches than the whole read "
                           f"at (world, rank) {bad}")
    base = max(r["data_rss_mb"] for r in rows_out if r["loader"] == "whole" and r["world"] == min(args.world))
    share1 = max(r["data_rss_mb"] for r in rows_out if r["loader"] == "share" and r["world"] == min(args.world))
    summary = []
    for loader in ("whole", "share"):
        for world in args.world:
            ranks = [r for r in rows_out if r["loader"] == loader and r["world"] == world]
            worst = max(ranks, key=lambda r: r["data_rss_mb"])
            for r in ranks:
                r["vs_whole_p1"] = r["data_rss_mb"] / base
                r["train_vs_whole_p1"] = r["data_rss_train_mb"] / base
            summary.append({"loader": loader, "world": world, "ranks": len(ranks),
                            "data_rss_train_mb": max(r["data_rss_train_mb"] for r in ranks),
                            "train_vs_whole_p1": max(r["data_rss_train_mb"] for r in ranks) / base,
                            "data_rss_mb": worst["data_rss_mb"], "vs_whole_p1": worst["data_rss_mb"] / base,
                            "vs_share_p1": worst["data_rss_mb"] / share1, "1/P": 1 / world,
                            "load_s": max(r["load_s"] for r in ranks), "steps_s": max(r["steps_s"] for r in ranks),
                            "plans_equal_whole": all(r["plans_equal_whole"] for r in ranks)})
    first = rows_out[0]
    print_table(summary, f"bench data --rank-share: data RSS per rank (peak VmHWM - VmRSS before loading, the "
                         f"largest over the ranks; train steps then one validation pass), twin of {first['users']:,} "
                         f"users, {first['events']:,} events ({first['data_in_memory_mb']:.0f} MiB as int64 arrays), "
                         f"max_len {first['max_len']}, batch {first['batch_size']}, {first['steps']} steps; "
                         f"CPU {hardware()['cpu']}")
    results.append_rows("bench_data", rows_out, cfg)
    return rows_out


if __name__ == "__main__":  # the child process of `measure` / `run_share`
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--share-child":
        _share_child(sys.argv[2])
    else:
        sys.exit("usage: python -m grlib.bench.data --child SPEC.json (run `python -m grlib bench data` instead)")
