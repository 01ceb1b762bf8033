"""Benchmark commands (`python -m grlib bench NAME`): each prints a table, writes result rows and
optionally JSON, and measures its baseline in the same run. The rows go to the ad-hoc tables
(results/adhoc/tables/, not in git) unless --record adds them to the committed results/tables/;
the command says where they went.

Each entry of BENCHES names a module with `add_arguments(parser)` and `run(args) -> list[dict]`.
"""
from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from grlib.config import add_config_arguments

BENCHES = {
    "ops": "grlib.bench.ops",
    "train": "grlib.bench.train",
    "data": "grlib.bench.data",
    "kernels": "grlib.bench.kernels",
    "negatives": "grlib.bench.negatives",
    "load": "grlib.bench.load",
    "balance": "grlib.bench.balance",
    "a2a": "grlib.bench.a2a",
    "pipeline": "grlib.bench.pipeline",
}


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks (each prints a table and appends result rows; "
                                         "ad-hoc unless --record)")
    names = bench.add_subparsers(dest="bench", required=True)
    for name, module in BENCHES.items():
        mod = importlib.import_module(module)
        p = names.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--json", default=None, help="also write the rows as a JSON list to this path")
        add_config_arguments(p)  # --scale (params.yaml's by default) and -o overrides
        p.add_argument("--record", action="store_true",
                       help="append the rows to the committed results/tables/ (default: results/adhoc/tables/)")
        mod.add_arguments(p)
        p.set_defaults(func=lambda args, mod=mod: _run(mod, args))


def _run(mod, args: argparse.Namespace) -> int:
    from grlib import io, results

    with results.adhoc(not args.record) as sink:
        rows = mod.run(args)
    if args.json:
        io.atomic_write_text(Path(args.json), json.dumps(rows, indent=2) + "\n")
    print(sink.note())
    return 0
