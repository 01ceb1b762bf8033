"""`python -m grlib data ...`: fetch real datasets and turn any dataset into sequences.

    python -m grlib data download --dataset kuairand-27k [--mirror URL]
    python -m grlib data prepare --dataset {synthetic,kuairand-pure,kuairand-1k,kuairand-27k,ml-100k} --out DIR
    python -m grlib data prepare --dataset kuairand-27k --raw-dir FOLDER --out DIR   # logs already on disk

--out DIR is built in a temporary sibling and renamed when complete. An existing DIR is replaced
only if it is empty or grlib made it (its .grlib-output marker file); any other folder, whatever
its files are called, the working folder and a checkout are refused (exit 2) and left untouched.
--mirror URL, else the environment variable GRLIB_MIRROR, fetches <URL>/<archive file name>
instead of the registry URL (Zenodo, GroupLens); the md5 is checked all the same.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grlib.config import add_config_arguments

from grlib.data.registry import DATASETS

OUT_HELP = ("output folder, built beside it and renamed when complete; an existing folder is replaced only "
            "if it is empty or grlib made it (its .grlib-output marker), else refused and left as it is; "
            "never the working folder")
MIRROR_HELP = ("base URL to fetch the archive from instead of the registry's (the archive's file name is kept, "
               "the md5 still checked); default $GRLIB_MIRROR")


def _download(args: argparse.Namespace) -> int:
    from grlib.data import download, registry

    spec = registry.get(args.dataset)
    cache = Path(args.cache) if args.cache else download.cache_dir()
    for path in download.log_paths(spec, cache, mirror=args.mirror):
        print(path)
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from grlib.config import config_from_args
    from grlib.data.catalog import prepare_to

    keys = ("max_len", "min_item_count", "target", "context", "bucket_rows", "n_users", "length_factor",
            "n_items", "seed")
    overrides = {f"data.{k}": getattr(args, k) for k in keys if getattr(args, k) is not None}
    cfg = config_from_args(args, {"data.dataset": args.dataset, **overrides})
    raw_dir = Path(args.raw_dir) if args.raw_dir else None
    stats = prepare_to(cfg.data, Path(args.out), raw_dir=raw_dir, mirror=args.mirror)
    print(json.dumps(stats, indent=2))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="download real datasets, prepare sequences")
    cmds = data.add_subparsers(dest="data_command", required=True)

    dl = cmds.add_parser("download", help="fetch (resumable, md5-checked, free disk checked first) and extract "
                                          "a dataset into the cache")
    dl.add_argument("--dataset", required=True, choices=[n for n in DATASETS])
    dl.add_argument("--cache", default=None, help="cache folder (default $GRLIB_CACHE_DIR or the user cache)")
    dl.add_argument("--mirror", default=None, metavar="URL", help=MIRROR_HELP)
    dl.set_defaults(func=_download)

    pr = cmds.add_parser("prepare", help="raw logs -> sequences.parquet, vocab.parquet, stats.json in --out")
    pr.add_argument("--dataset", required=True, choices=["synthetic", *DATASETS])
    pr.add_argument("--out", required=True, help=OUT_HELP)
    source = pr.add_mutually_exclusive_group()
    source.add_argument("--raw-dir", default=None, metavar="FOLDER",
                        help="read the dataset's log files from this folder (searched in subfolders too) "
                             "instead of the download cache")
    source.add_argument("--mirror", default=None, metavar="URL", help=MIRROR_HELP)
    add_config_arguments(pr)  # the scale's data section gives the defaults; -o data.KEY=VALUE like the flags below
    for name, typ in (("max-len", int), ("min-item-count", int), ("target", str), ("context", str),
                      ("bucket-rows", int), ("n-users", int), ("length-factor", float), ("n-items", int),
                      ("seed", int)):
        pr.add_argument(f"--{name}", type=typ, default=None, help=f"overrides data.{name.replace('-', '_')}")
    pr.set_defaults(func=_prepare)
