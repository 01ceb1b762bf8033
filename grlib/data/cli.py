"""`python -m grlib data ...`: fetch real datasets and turn any dataset into sequences.

    python -m grlib data download --dataset kuairand-27k
    python -m grlib data prepare --dataset {synthetic,kuairand-pure,kuairand-1k,kuairand-27k,ml-100k} --out DIR
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grlib.data.registry import DATASETS


def _download(args: argparse.Namespace) -> int:
    from grlib.data import download, registry

    spec = registry.get(args.dataset)
    cache = Path(args.cache) if args.cache else download.cache_dir()
    for path in download.log_paths(spec, cache):
        print(path)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from grlib.config import load_config
    from grlib.experiments.data_stage import prepare_to

    keys = ("max_len", "min_item_count", "target", "context", "bucket_rows", "n_users", "length_factor",
            "n_items", "seed")
    overrides = {f"data.{k}": getattr(args, k) for k in keys if getattr(args, k) is not None}
    cfg = load_config(args.scale, {"data.dataset": args.dataset, **overrides})
    stats = prepare_to(cfg.data, Path(args.out))
    print(json.dumps(stats, indent=2))
    return 0


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="download real datasets, prepare sequences")
    cmds = data.add_subparsers(dest="data_command", required=True)

    dl = cmds.add_parser("download", help="fetch (resumable, md5-checked) and extract a dataset into the cache")
    dl.add_argument("--dataset", required=True, choices=[n for n in DATASETS])
    dl.add_argument("--cache", default=None, help="cache folder (default $GRLIB_CACHE_DIR or the user cache)")
    dl.set_defaults(func=_download)

    pr = cmds.add_parser("prepare", help="raw logs -> sequences.parquet, vocab.parquet, stats.json in --out")
    pr.add_argument("--dataset", required=True, choices=["synthetic", *DATASETS])
    pr.add_argument("--out", required=True, help="output folder (replaced atomically)")
    pr.add_argument("--scale", default="smoke", help="scale whose data section gives the defaults (default smoke)")
    for name, typ in (("max-len", int), ("min-item-count", int), ("target", str), ("context", str),
                      ("bucket-rows", int), ("n-users", int), ("length-factor", float), ("n-items", int),
                      ("seed", int)):
        pr.add_argument(f"--{name}", type=typ, default=None, help=f"overrides data.{name.replace('-', '_')}")
    pr.set_defaults(func=_prepare)
