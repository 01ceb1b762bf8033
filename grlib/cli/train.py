"""`python -m grlib train`: train and evaluate one model on one dataset, print and save its metrics.

    python -m grlib train --scale smoke --dataset ml-100k --model hstu --json out.json
    python -m grlib train --scale laptop --model sasrec --seed 1 --checkpoint-dir ckpt --checkpoint-every 50
    python -m grlib train --scale smoke --data D   # a folder `data prepare --out D` made
    python -m grlib train --params-only            # parameters of every scale's HSTU (paper: ~0.2B dense)
    python -m grlib train --scale smoke --world 2 --balance kk     # 2 data-parallel ranks (gloo on CPU)
    torchrun --nnodes N --nproc-per-node L -m grlib train --scale S --balance kk   # N nodes x L devices

Data parallel (grlib.fit.fit_distributed, grlib.distributed.data_parallel): --world N starts N processes
here (one intra-op thread each on CPU); under torchrun the world comes from its environment (nccl on
CUDA, hccl on Ascend, gloo on CPU). Every rank trains its share of the same global batches, so the
losses are those of one process (within float summation order); only rank 0 prints and writes the
row, which records world, nodes and the balancer. On one process the data-parallel flags (--nodes,
--balance, --cost, --items, --dedup, --schedule, --staleness) are refused with one error line:
nothing would read them.

The data comes from the dataset catalogue (grlib.data.catalog): with data.* overrides (e.g.
-o data.max_len=64) it is prepared once into a folder of its own; the scale's stays as it is.
A dataset's own settings (params.yaml `datasets`, e.g. ML-100K's full softmax at temperature 0.2,
d 64) apply on top of the scale's (stderr names them); an -o of the same key wins. --data DIR trains
on a folder `data prepare` made instead (its dataset and data settings from its stats.json; any
other folder is refused with one line). A test split under 100 users is said with its count.
JSON keys: ndcg@10, hr@10, mrr (test), params, tokens_per_s, mfu, plus every val_/test_ metric.
The row is also appended to table train_runs: under results/adhoc/tables/ unless --record
(then results/tables/). With --checkpoint-dir a run resumes
from its last.pt (saying so on stderr) only if it was written with the same dataset, data, model,
train and negatives settings; otherwise it stops with one line naming what differs. A run whose
checkpoint is already at its last step says so in one line and writes no row.

Before anything is allocated, the memory the run needs is estimated from its config
(grlib.train.footprint: tables with their optimizer state, one step's activations, the evaluation's
scores) and compared with the free memory (MemAvailable, cut by the cgroup's limit): first on what
the config alone shows, before any data is prepared (SASRec's padding to data.max_len, its positions
table), then with the prepared data's sizes (items, longest window), before the model is built. A run
that does not fit stops with one line naming the estimate, its largest terms, the settings behind
them and the free memory; --force runs it anyway (the figures said on stderr). --world N counts N
ranks' estimates; a torchrun rank counts its node's LOCAL_WORLD_SIZE ranks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from grlib import schedules
from grlib.config import ConfigError, DistConfig, choices, parse_overrides

KEYS = ("ndcg@10", "hr@10", "mrr", "params", "tokens_per_s", "mfu")
FEW_USERS = 100  # a test split under this many users is said with its count


def int_at_least(low: int):
    """An argparse type: an integer >= low (argparse turns the refusal into one error line, exit 2)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    parse.__name__ = f"int >= {low}"
    return parse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train and evaluate one model (full ranking); print and save metrics")
    p.add_argument("--scale", default=None, help="named scale from params.yaml (default: params.yaml's scale)")
    p.add_argument("--dataset", default="scale",
                   help="'scale' (the scale's own data) or a dataset name, e.g. ml-100k, synthetic; the dataset's "
                        "own settings in params.yaml `datasets` apply (an -o of the same key wins)")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="train on a folder `python -m grlib data prepare --out DIR` made (its dataset and data "
                        "settings), instead of --dataset")
    p.add_argument("--model", default="hstu", choices=("hstu", "sasrec", "popularity"))
    p.add_argument("--seed", type=int, default=None, help="train.seed (default: the scale's)")
    p.add_argument("--max-steps", type=int, default=None, help="train.max_steps")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. -o model.d_model=128 -o train.lr=3e-4 (YAML values)")
    p.add_argument("--checkpoint-dir", default=None, help="write last.pt here and resume from it if present")
    p.add_argument("--checkpoint-every", type=int_at_least(0), default=0, help="checkpoint every N steps (and each epoch end)")
    p.add_argument("--losses", default=None, help="also write the per-step losses as a JSON list to this path")
    p.add_argument("--json", default=None, help="write the metrics as JSON to this path")
    p.add_argument("--record", action="store_true",
                   help="append the row to the committed results/tables/ (default: results/adhoc/tables/)")
    p.add_argument("--world", type=int_at_least(1), default=None, help="data-parallel ranks to start here (dist.world, default 1)")
    p.add_argument("--nodes", type=int_at_least(1), default=None, help="nodes the ranks act as (LOCAL_WORLD_SIZE = world / nodes)")
    p.add_argument("--balance", default=None, choices=choices.BALANCERS,
                   help="how the global batch's sequences go to ranks (none: contiguous split)")
    p.add_argument("--cost", default=None, choices=choices.BALANCE_COSTS, help="the cost the balancer evens out")
    p.add_argument("--backend", default=None, choices=choices.BACKENDS, help="torch.distributed backend")
    p.add_argument("--items", default=None, choices=choices.ITEM_SHARDING,
                   help="the item table on every rank, or row-sharded over ranks with a flat or two-stage all-to-all")
    p.add_argument("--dedup", default=None, choices=choices.ITEM_DEDUP,
                   help="sharded items: send each id once per rank, or once per node (hierarchical only)")
    p.add_argument("--schedule", default=None, choices=schedules.names(),
                   help="; ".join(f"{s.name}: {s.summary}" for s in schedules.specs()) +
                        f" (registered in grlib.schedules; more: plugin files in ${schedules.PLUGINS_ENV})")
    p.add_argument("--staleness", type=int_at_least(0), default=None,
                   help=f"k of {', '.join(schedules.with_trait('stale'))} (0 = the rows of sync)")
    p.add_argument("--force", action="store_true",
                   help="run even when the estimated memory exceeds the free memory (grlib.train.footprint; "
                        "the figures are said on stderr)")
    p.add_argument("--params-only", action="store_true",
                   help="only print every scale's parameter counts (meta device, no data, no training)")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from grlib import results
    from grlib.config import load_config
    from grlib.results import atomic_write_bytes

    if args.params_only:
        import polars as pl

        from grlib.experiments.train_stage import preset_table

        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200, thousands_separator=True):
            print(preset_table([args.scale] if args.scale else None))
        return 0
    overrides = parse_overrides(args.override)
    overrides["model.name"] = args.model
    if args.seed is not None:
        overrides["train.seed"] = args.seed
    if args.max_steps is not None:
        overrides["train.max_steps"] = args.max_steps
    given = _dist_overrides(args, overrides)
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world == 1 and overrides.get("dist.world", 1) == 1:
        _refuse_moot_dist_settings(given)
    dataset, explicit = args.dataset, dict(overrides)
    if args.data is not None:
        dataset, data_settings = _prepared_data(args, overrides)
        overrides = {**data_settings, **overrides}
    cfg = load_config(args.scale, overrides, dataset=dataset)
    _say_dataset_settings(cfg, dataset, explicit)
    if env_world > 1 or cfg.dist.world > 1:
        if args.data is not None:
            raise ConfigError("--data: data-parallel ranks read a catalogue dataset; train a prepared folder on one "
                              "process (leave --world out)")
        if args.model == "popularity":
            raise ConfigError("--world: the popularity model does no training; run it on one process")
        if env_world > 1:  # a torchrun rank: its node's ranks are running; rank 0 prepares the data (fit_rank)
            _check_memory(args, cfg, env_world, int(os.environ.get("LOCAL_WORLD_SIZE", env_world)), prepare=False)
        else:  # ranks started here, after the data is prepared once in this process (as fit_distributed would)
            _check_memory(args, cfg, cfg.dist.world, started=False)
        from grlib.fit import fit_distributed

        got = fit_distributed(cfg, args.dataset, args.checkpoint_dir, args.checkpoint_every)
        if got is None:  # a rank other than 0 under torchrun: rank 0 reports
            return 0
        name, row, losses = got["dataset"], got["row"], got["losses"]
    else:
        from grlib.data.catalog import load_dataset, load_prepared

        _check_memory(args, cfg)  # before the data is loaded and the model built
        from grlib.fit import fit_and_evaluate, model_peak

        ds = load_prepared(cfg, Path(args.data)) if args.data is not None else load_dataset(cfg, args.dataset)
        peak = model_peak(cfg)  # measured in this run, before training, in the model's precision
        fit = fit_and_evaluate(cfg, ds, peak, checkpoint_dir=args.checkpoint_dir,
                               checkpoint_every=args.checkpoint_every)
        name, row, losses = ds.name, fit.row, fit.losses
    if row.get("resumed_from") and row["steps"] == row["resumed_from"]:
        return 0  # a finished run resumed: the loop said so in one line; no row (it would read 0 tokens/s, mfu nan)
    out = {"scale": cfg.scale, "dataset": name, "model": args.model, "seed": cfg.train.seed, **row}
    if args.model == "popularity":
        out.update(mfu=None)
    out.update({k: out[f"test_{k}"] for k in ("ndcg@10", "hr@10", "mrr")})
    print("  ".join(f"{k}={_fmt(out[k])}" for k in ("dataset", "model", "seed", "steps", *KEYS)))
    users = out.get("test_users")
    if users is not None and users < FEW_USERS:
        print(f"evaluated {users} test user{'s' if users != 1 else ''} (under {FEW_USERS}): these metrics are one "
              f"small sample's, far from a dataset's figure")
    with results.adhoc(not args.record) as sink:
        results.append_rows("train_runs", [{k: v for k, v in out.items() if k not in ("scale",)}], cfg)
    print(sink.note())
    if args.json:
        atomic_write_bytes(Path(args.json), (json.dumps(out, indent=2) + "\n").encode())
    if args.losses and args.model != "popularity":
        atomic_write_bytes(Path(args.losses), (json.dumps(losses) + "\n").encode())
    return 0


def _prepared_stats_if_any(args: argparse.Namespace, cfg) -> dict | None:
    """The stats.json of the data this run trains on when it is already prepared (--data DIR, or the
    catalogue's folder prepared with these data settings); None when it is not (yet)."""
    from grlib.data.catalog import data_key, dataset_config, folder, prepared_key, prepared_stats

    if args.data is not None:
        return prepared_stats(Path(args.data))
    out = folder(cfg, args.dataset)
    if prepared_key(out) != data_key(dataset_config(cfg, args.dataset)):
        return None
    try:
        stats = json.loads((out / "stats.json").read_text())
    except (OSError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None


def _check_memory(args: argparse.Namespace, cfg, world: int = 1, local: int | None = None, *, started: bool = True,
                  prepare: bool = True) -> None:
    """Refuses (MemoryRefused, one line) a run whose estimated memory exceeds the free memory
    (grlib.train.footprint), `local` of its `world` ranks on this machine (`started`: their processes
    exist, this one among them). Where the data is not prepared yet, first on what the config alone
    shows (nothing prepared or allocated), then, with `prepare`, once it is prepared (what loading it
    would do first) on the data's sizes too. --force: no refusal, the figures said once on stderr."""
    from grlib.data.catalog import ensure_prepared
    from grlib.train import footprint

    stats = _prepared_stats_if_any(args, cfg)
    if stats is None and prepare:
        if not args.force:
            footprint.check(cfg, footprint.DataShape(), world, local, started=started)
        stats = json.loads((ensure_prepared(cfg, args.dataset) / "stats.json").read_text())
    shape = footprint.DataShape.from_stats(stats, cfg.data.max_len) if stats else footprint.DataShape()
    footprint.check(cfg, shape, world, local, started=started, force=args.force)


def _prepared_data(args: argparse.Namespace, overrides: dict) -> tuple[str, dict]:
    """--data DIR: (its dataset, its data settings as data.* overrides); DataError for a folder
    `data prepare` did not make; --dataset or a data.* override beside it are refused (the folder fixes them)."""
    from grlib.data.catalog import PREPARED_DATA_FIELDS, prepared_stats

    if args.dataset != "scale":
        raise ConfigError(f"--data {args.data} and --dataset {args.dataset}: the folder names its dataset; give one of them")
    data_keys = [k for k in overrides if k.startswith("data.") or k == "data"]
    if data_keys:
        raise ConfigError(f"--data {args.data}: -o {data_keys[0]} would not change the prepared folder; prepare "
                          f"another with `python -m grlib data prepare` and those settings")
    stats = prepared_stats(Path(args.data))
    return stats["dataset"], {f"data.{k}": stats[k] for k in PREPARED_DATA_FIELDS}


def _say_dataset_settings(cfg, dataset: str, explicit: dict) -> None:
    """One stderr line naming the dataset's own settings (params.yaml `datasets`) this run takes."""
    import sys

    from grlib.config import dataset_settings

    name = cfg.data.dataset if dataset == "scale" else dataset
    settings = dataset_settings(name)
    if not settings:
        return
    kept = [f"{k}={v}" for k, v in settings.items() if k not in explicit]
    won = [k for k in settings if k in explicit]
    print(f"dataset {name}: its own settings from params.yaml datasets.{name}: {' '.join(kept) or '(none left)'}"
          + (f" (-o wins for {', '.join(won)})" if won else ""), file=sys.stderr, flush=True)


# train's flags, each the shorthand of a dist field (--balance kk = -o dist.balance=kk)
_DIST_FLAGS = ("world", "nodes", "backend", "balance", "cost", "items", "dedup", "schedule", "staleness")
# the fields one process reads (the rest are read by data-parallel ranks only)
_ONE_PROCESS_FIELDS = ("world", "backend", "timeout_s")


def _dist_overrides(args: argparse.Namespace, overrides: dict) -> dict[str, tuple[str, object]]:
    """Adds each given flag to `overrides` as its dist.* key; -> {field: (how the user set it, value)}.
    A flag and an -o of the same field that disagree are refused."""
    given = {k[5:]: (f"-o {k}={v}", v) for k, v in overrides.items() if k.startswith("dist.")}
    for flag in _DIST_FLAGS:
        value = getattr(args, flag)
        if value is None:
            continue
        key = f"dist.{flag}"
        if key in overrides and overrides[key] != value:
            raise ConfigError(f"--{flag}={value} and -o {key}={overrides[key]} disagree; give one of them")
        overrides[key], given[flag] = value, (f"--{flag}={value}", value)
    return given


def _refuse_moot_dist_settings(given: dict[str, tuple[str, object]]) -> None:
    """One process trains: a data-parallel setting given away from its default would be read by nothing."""
    default = DistConfig()
    norm = lambda v: tuple(v) if isinstance(v, list) else v  # noqa: E731  (YAML lists, tuple fields)
    moot = [how for name, (how, value) in given.items()
            if name not in _ONE_PROCESS_FIELDS and norm(value) != getattr(default, name, None)]
    if moot:
        it = "it" if len(moot) == 1 else "them"
        raise ConfigError(f"{' '.join(moot)}: only data-parallel ranks read {it}, and --world is 1 (dist.world: one "
                          f"process); start N ranks with --world N, or leave {it} out")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else "nan"
    return "-" if v is None else str(v)
