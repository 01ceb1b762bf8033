"""`python -m grlib ...` (and the `grlib` script): the command-line face of the workbench.

    python -m grlib notebook 02_train --scale laptop [-p key value ...]
    python -m grlib config --scale laptop [--dataset ml-100k] [-o model.d_model=128 ...]
    python -m grlib bench ops --json out.json
    python -m grlib train --scale smoke --dataset ml-100k --model hstu --json out.json
    python -m grlib data prepare --dataset synthetic --out DIR
    python -m grlib claims [--scale laptop] [--checks]
    python -m grlib import-rows OUT/device_check.json    (the rows of `make device-check` on a GPU)
    python -m grlib clean [--dry-run] [--path DIR]       (the leftovers of killed runs; `make clean-tmp`)

A user mistake (a bad scale, parameter, override, params.yaml, data file, download, checkpoint or
output folder, process layout, a config that does not fit the free memory, a full disk, or a
notebook cell that raised) prints one line `error: ...` on stderr and exits with
status 2. A rank of a multi-process run that fails prints `error:` with the rank and its traceback's
tail, and exits with status 1.
"""
# One module per command: notebook (with the papermill runner), train, data, claims, clean; `config` is below and
# the benchmarks are grlib.bench. Commands call experiments and the library, never the other way
# round (tests/test_layers.py).
from __future__ import annotations

import argparse
import json
import sys

from grlib import config
from grlib.schema import DataError
from grlib.io import OutputRefused
from grlib.progress import ProgressSettingError


def _config(args: argparse.Namespace) -> int:
    cfg = config.load_config(args.scale, config.parse_overrides(args.override), dataset=args.dataset)
    print(json.dumps(cfg.to_dict(), indent=2))
    print(f"params_hash: {cfg.params_hash()}")
    name = cfg.data.dataset if args.dataset == "scale" else args.dataset
    settings = config.dataset_settings(name)
    print(f"dataset {name}: " + (f"its own settings (params.yaml datasets.{name}, under -o): "
                                 f"{' '.join(f'{k}={v}' for k, v in settings.items())}" if settings
                                 else "no settings of its own (params.yaml datasets)"))
    return 0


def build_parser(complete: bool = False) -> argparse.ArgumentParser:
    """The parser of every command; a bench's own arguments are added when it is named (its module
    imported then), or all at once with `complete` (to read the parsers without parsing)."""
    from grlib.bench import add_bench_parser
    from grlib.cli import claims, clean, data, import_rows, notebook, train

    parser = argparse.ArgumentParser(prog="python -m grlib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    notebook.add_parser(sub)
    cf = sub.add_parser("config", help="print the resolved config of a scale")
    cf.add_argument("--scale", default=None, help="named scale from params.yaml (default: params.yaml's scale)")
    cf.add_argument("--dataset", default="scale", choices=("scale", *config.choices.DATASETS),
                    help="'scale' (the scale's data.dataset) or a dataset name: its own settings (params.yaml "
                         "`datasets`) go on top of the scale's, as `train --dataset` takes them")
    cf.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. -o model.d_model=128 -o train.lr=3e-4 (YAML values)")
    cf.set_defaults(func=_config)

    add_bench_parser(sub, complete)
    data.add_parser(sub)
    train.add_parser(sub)
    claims.add_parser(sub)
    import_rows.add_parser(sub)
    clean.add_parser(sub)
    return parser


def _loaded(module: str, name: str) -> type[BaseException] | None:
    return getattr(sys.modules.get(module), name, None)


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that report a user mistake, each defined where it is raised. Those of modules that
    import torch are looked up among the modules already loaded (an exception of a module never imported
    cannot have been raised), so that reporting an error loads nothing: `data prepare` refusing a hostile
    file stays within its memory bound (tests/test_trust_inputs.py)."""
    found = (_loaded(module, name) for module, name in (
        ("grlib.cli.clean", "CleanError"), ("grlib.cli.notebook", "NotebookError"),
        ("grlib.cli.notebook", "NotebookFailed"), ("grlib.train.checkpoint", "CheckpointError"),
        ("grlib.distributed.topology", "TopologyError")))
    return (config.ConfigError, DataError, OutputRefused, ProgressSettingError, *(c for c in found if c))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as err:
        if isinstance(err, user_errors()):
            print(f"error: {_one_line(str(err))}", file=sys.stderr)
            return 2
        failed = _loaded("grlib.distributed.launch", "RankFailed")
        if failed is not None and isinstance(err, failed):  # a rank of `train --world N` failed: its traceback's tail
            print(f"error: {err}", file=sys.stderr)
            return 1
        raise


def _one_line(message: str) -> str:
    return " ".join(message.split())
