"""Benchmark commands (`python -m grlib bench NAME`): each parses its arguments, runs its method (in
grlib.experiments, which measures the baseline in the same run), prints a table within 120 columns
(grlib.bench.common.print_table; --wide: every column) and writes result rows, optionally JSON. The
rows go to the ad-hoc tables (results/adhoc/tables/, not in git) unless --record adds them to the
committed results/tables/; the command says where they went. Library warnings and the profiler's
USDT lines are kept off the terminal unless -v / --verbose (grlib.terminal).

Each entry of BENCHES names a module with `add_arguments(parser)` and `run(args) -> list[dict]`.
A bench module is imported only when the command line names it, and imports its experiment (and
with it altair) inside `run`, so `--help` and the parser import no stage (tests/test_cli_startup.py).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
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


def add_bench_parser(sub: argparse._SubParsersAction, complete: bool = False) -> None:
    """The `bench` command. Each bench's own arguments are added when the command line names it
    (BenchParser), or at once with `complete` (for code that reads the parsers without parsing)."""
    bench = sub.add_parser("bench", help="benchmarks (each prints a table and appends result rows; "
                                         "ad-hoc unless --record)")
    names = bench.add_subparsers(dest="bench", required=True, parser_class=BenchParser)
    for name, module in BENCHES.items():
        p = names.add_parser(name, help=_summary(module))
        p.add_argument("--json", default=None, help="also write the rows as a JSON list to this path")
        add_config_arguments(p)  # --scale (params.yaml's by default) and -o overrides
        p.add_argument("--record", action="store_true",
                       help="append the rows to the committed results/tables/ (default: results/adhoc/tables/)")
        p.add_argument("--wide", action="store_true",
                       help="print every column (default: the ones a reader compares, within 120 characters)")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="let library warnings (torch dynamo, UserWarnings) and profiler lines through")
        p.module = module
        p.set_defaults(func=lambda args, module=module: _run(importlib.import_module(module), args))
        if complete:
            p.populate()


class BenchParser(argparse.ArgumentParser):
    """One bench's parser: its module is imported, and its `add_arguments` called, when the command
    line names that bench (argparse hands it the rest of the command line), so neither
    `python -m grlib --help` nor `bench NAME --help` imports another bench."""

    module: str | None = None

    def populate(self) -> "BenchParser":
        if self.module is not None:
            module, self.module = self.module, None
            importlib.import_module(module).add_arguments(self)
        return self

    def parse_known_args(self, args=None, namespace=None):
        self.populate()
        return super().parse_known_args(args, namespace)


def _summary(module: str) -> str:
    """The first line of a bench module's docstring, read from its source without importing it."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    return (ast.get_docstring(tree) or "").strip().splitlines()[0]


def _run(mod, args: argparse.Namespace) -> int:
    from grlib import io, results, terminal
    from grlib.bench import common

    common.show_all, terminal.verbose = args.wide, args.verbose
    with results.adhoc(not args.record) as sink, terminal.library_noise(args.verbose):
        rows = mod.run(args)
    if args.json:
        io.atomic_write_text(Path(args.json), json.dumps(rows, indent=2) + "\n")
    print(terminal.wrap(sink.note()))
    return 0
