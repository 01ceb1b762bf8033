"""`python -m grlib ...`: run notebooks, show configs, run benchmarks.

    python -m grlib notebook 02_train --scale laptop [-p key value ...]
    python -m grlib config --scale laptop [-o model.d_model=128 ...]
    python -m grlib bench ops --json out.json
    python -m grlib train --scale smoke --dataset ml-100k --model hstu --json out.json
    python -m grlib data prepare --dataset synthetic --out DIR

A user mistake (a bad scale, parameter, override, data file, checkpoint or output folder, or a
notebook cell that raised) prints one line `error: ...` on stderr and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys

from grlib import config
from grlib.data.schema import DataError
from grlib.io import OutputRefused
from grlib.progress import ProgressSettingError


def _notebook(args: argparse.Namespace) -> int:
    from grlib.notebooks import run_notebook

    params = {k: v for k, v in (args.param or [])}
    out = run_notebook(args.name, scale=args.scale, parameters=params, output=args.output)
    print(out)
    return 0


def _config(args: argparse.Namespace) -> int:
    cfg = config.load_config(args.scale, config.parse_overrides(args.override))
    print(json.dumps(cfg.to_dict(), indent=2))
    print(f"params_hash: {cfg.params_hash()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from grlib.bench import add_bench_parser
    from grlib.data.cli import add_data_parser

    parser = argparse.ArgumentParser(prog="python -m grlib", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    nb = sub.add_parser("notebook", help="run notebooks/<name>.ipynb with papermill into results/executed/<scale>/")
    nb.add_argument("name", help="notebook name without .ipynb, e.g. 02_train")
    nb.add_argument("--scale", default=None, help="named scale from params.yaml (default: params.yaml's scale)")
    nb.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"),
                    help="extra papermill parameter (YAML value)")
    nb.add_argument("--output", default=None, help="executed notebook path (default results/executed/<scale>/<name>.ipynb)")
    nb.set_defaults(func=_notebook)

    cf = sub.add_parser("config", help="print the resolved config of a scale")
    cf.add_argument("--scale", default=None, help="named scale from params.yaml (default: params.yaml's scale)")
    cf.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. -o model.d_model=128 -o train.lr=3e-4 (YAML values)")
    cf.set_defaults(func=_config)

    add_bench_parser(sub)
    add_data_parser(sub)
    from grlib.train.cli import add_train_parser

    add_train_parser(sub)
    return parser


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that report a user mistake (each defined where it is raised)."""
    from grlib.notebooks import NotebookError, NotebookFailed
    from grlib.train.checkpoint import CheckpointError

    return (config.ConfigError, DataError, OutputRefused, ProgressSettingError, NotebookError, NotebookFailed,
            CheckpointError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except user_errors() as err:
        print(f"error: {_one_line(str(err))}", file=sys.stderr)
        return 2


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
