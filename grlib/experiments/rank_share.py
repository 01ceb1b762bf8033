"""The data memory of the ranks of a data-parallel run, per rank (`bench data --rank-share`).

At world sizes P (1, 2, 4 by default) on one synthetic twin (prepared once, `share_users` users at
`share_length_factor`, cut to `share_max_len`), each rank runs in a fresh child, one after the other
(grlib.probes.rank_data; a rank's data path does not communicate: the Planner is deterministic and
the fingerprint all-gather is the step's): it loads the data, then plans `steps` global batches as
a rank of P (assignment, negatives, its sub-batch), then reads one validation pass. Two loaders, in
the same run: "whole" (SequenceData.load: every rank reads the whole table, the baseline) and
"share" (grlib.data.share: flat files read per batch, global batches known by their lengths). Per
rank: VmRSS before loading (after the imports), the peak (VmHWM) after the steps and after the
validation pass: data_rss_train_mb and data_rss_mb = peak - before (the validation pass holds an
eval batch, train.eval_batch_size windows and histories); the plans' checksum (fingerprints and
local token sums), which must be the same for both loaders.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from grlib.config import Config


@dataclasses.dataclass(frozen=True)
class Options:
    """Ranks P, the twin's users, length factor and data.max_len, sequences per global batch, global
    batches planned (0: one epoch), and where the children's files go (None: the system's temp)."""

    world: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4])
    share_users: int = 2000
    share_length_factor: float = 0.5
    share_max_len: int = 4096
    batch_size: int = 16
    steps: int = 0
    workdir: str | None = None


def twin_overrides(opt: Options) -> dict:
    """The config of the synthetic twin (on top of the command's -o overrides)."""
    return {"data.dataset": "synthetic", "data.n_users": opt.share_users,
            "data.length_factor": opt.share_length_factor, "data.max_len": opt.share_max_len}


def measure(cfg: Config, user_overrides: dict, opt: Options) -> tuple[list[dict], list[dict], str]:
    """Whole vs share, per rank, at each world size (the module docstring): the rows (table
    bench_data, method "rank-share"), the summary per (loader, world) and its title. cfg: the
    scale's config with user_overrides and twin_overrides(opt); the children rebuild it from those."""
    from grlib.data.catalog import ensure_prepared
    from grlib.data.share import ensure_arrays

    overrides = twin_overrides(opt)
    folder = ensure_prepared(cfg)
    arrays = ensure_arrays(folder)
    stats = json.loads((folder / "stats.json").read_text())
    events = stats["events"]
    whole_mb = events * 25 / 2**20  # int64 items, actions, timestamps + bool is_target per event
    rows_out = []
    work = Path(tempfile.mkdtemp(dir=opt.workdir, prefix="grlib-bench-share-"))
    try:
        for world in opt.world:
            for loader in ("whole", "share"):
                for rank in range(world):
                    spec_path, result = work / "spec.json", work / f"result-{loader}-{world}-{rank}.json"
                    spec_path.write_text(json.dumps({
                        "loader": loader, "rank": rank, "world": world, "scale": cfg.scale,
                        "overrides": {**user_overrides, **overrides}, "folder": str(folder),
                        "arrays": str(arrays), "steps": opt.steps, "batch_size": opt.batch_size,
                        "result": str(result)}))
                    code = subprocess.call([sys.executable, "-m", "grlib.probes.rank_data", str(spec_path)])
                    if code != 0:
                        raise RuntimeError(f"bench data --rank-share: the {loader} child of rank {rank} of {world} "
                                           f"failed (exit {code})")
                    m = json.loads(result.read_text())
                    rows_out.append({"method": "rank-share", "loader": loader, "world": world, "rank": rank,
                                     "users": stats["users"], "events": events, "data_in_memory_mb": whole_mb,
                                     "max_len": opt.share_max_len, "batch_size": opt.batch_size,
                                     "before_mb": m["before_mb"], "rss_end_mb": m["rss_end_mb"],
                                     "data_rss_train_mb": m["hwm_train_mb"] - m["before_mb"],
                                     "data_rss_mb": m["hwm_eval_mb"] - m["before_mb"],
                                     "load_s": m["load_s"], "steps": m["steps"], "steps_s": m["steps_s"],
                                     "checksum": str(m["checksum"])})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows_out, *summarize(rows_out, opt)


def summarize(rows_out: list[dict], opt: Options) -> tuple[list[dict], str]:
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
    base = max(r["data_rss_mb"] for r in rows_out if r["loader"] == "whole" and r["world"] == min(opt.world))
    share1 = max(r["data_rss_mb"] for r in rows_out if r["loader"] == "share" and r["world"] == min(opt.world))
    summary = []
    for loader in ("whole", "share"):
        for world in opt.world:
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
    return summary, (f"bench data --rank-share: data RSS per rank (peak VmHWM - VmRSS before loading, the "
                     f"largest over the ranks; train steps then one validation pass), twin of {first['users']:,} "
                     f"users, {first['events']:,} events ({first['data_in_memory_mb']:.0f} MiB as int64 arrays), "
                     f"max_len {first['max_len']}, batch {first['batch_size']}, {first['steps']} steps; "
                     f"CPU {hardware()['cpu']}")
