"""`python -m grlib ...`: run notebooks, show configs, run benchmarks.

    python -m grlib notebook 02_train --scale laptop [-p key value ...]
    python -m grlib config --scale laptop
    python -m grlib bench ops --json out.json
    python -m grlib train --scale smoke --dataset ml-100k --model hstu --json out.json
    python -m grlib data prepare --dataset synthetic --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys

from grlib import config
from grlib.data.schema import DataError


def _notebook(args: argparse.Namespace) -> int:
    from grlib.notebooks import run_notebook

    params = {k: v for k, v in (args.param or [])}
    out = run_notebook(args.name, scale=args.scale, parameters=params, output=args.output)
    print(out)
    return 0


def _config(args: argparse.Namespace) -> int:
    cfg = config.load_config(args.scale)
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
    cf.add_argument("--scale", default=None)
    cf.set_defaults(func=_config)

    add_bench_parser(sub)
    add_data_parser(sub)
    from grlib.train.cli import add_train_parser

    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (config.ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
