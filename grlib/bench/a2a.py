"""Hierarchical sparse parallelism (claim C3): all-to-all measured here, counted, and modelled at cluster scale.

Runs the `ablations.sparse` grid of params.yaml (flags override single fields), the sparse stage's
method (grlib.experiments.sparse_stage): all_to_all_single timed on 2 (and 4 as 2 x 2) gloo
processes with an alpha-beta fit, the link counters of one row-sharded lookup of a training batch
(flat vs hierarchical, rank vs node de-duplication; 4 ranks as 2 nodes x 2), the alpha-beta model of
the gpu-8 / npu-16 presets at the paper's shape, the item table's bytes per rank (measured here,
computed for KuaiRand-27K), and TorchRec's row-wise lookup beside grlib's where torchrec is installed.
Flat is the baseline of every cut, modelled on the same parameters. Rows go to table `sparse`
(ad-hoc unless --record).
"""
from __future__ import annotations

import argparse

from grlib import results
from grlib.bench.common import ablation_from_args, print_table, positive_int
from grlib.config import config_from_args
from grlib.config.choices import SPARSE_PARTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", nargs="+", default=list(SPARSE_PARTS), choices=SPARSE_PARTS,
                   help="parts to run (gloo, counters, memory and torchrec launch gloo processes)")
    p.add_argument("--presets", nargs="+", default=None, help="modelled clusters (grlib.sim.alltoall.PRESETS)")
    p.add_argument("--ranks", nargs="+", type=positive_int, default=None, help="modelled rank counts (whole nodes)")
    p.add_argument("--gloo-sizes", nargs="+", type=positive_int, default=None, help="measured bytes per peer")
    p.add_argument("--gloo-repeats", type=positive_int, default=None, help="timed all-to-alls per size")
    p.add_argument("--quick", action="store_true", help="the reduced grid of the notebook's default (seconds)")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import claims as registry
    from grlib.experiments import sparse_stage
    from grlib.experiments.claims import Figure
    from grlib.experiments.report import VERDICTS

    cfg = config_from_args(args)
    names = ["presets", "ranks", "gloo_sizes", "gloo_repeats"]
    ab = ablation_from_args("sparse", args, names, sparse_stage.quick)
    rows = sparse_stage.measure(cfg, ab, tuple(args.parts))
    table = results.append_rows(sparse_stage.TABLE, rows, cfg)
    notes = {"gloo": "measured here, gloo over loopback; error = model / measured - 1",
             "counters": f"measured: bytes and messages each rank sends (ids out, rows back), d={cfg.model.d_model}",
             "model": "modelled: alpha-beta, the paper's shape; cut = 1 - two-stage / flat",
             "memory": "measured (the scale's table) and computed (KuaiRand-27K x the paper's d_model)",
             "torchrec": "measured: the same ids, TorchRec row-wise vs grlib flat"}
    for part in args.parts:
        print_table(sparse_stage.view(table, part).to_dicts(), f"bench a2a: {part} (scale {cfg.scale}; {notes[part]})")
    print("\nacceptance checks (claim C3)")
    for c in sparse_stage.acceptance(table).iter_rows(named=True):
        ours = Figure.of(c["value"], registry.target(c["target"]).unit).short()
        print(f"  {c['target']:<15} {ours:>8}  {VERDICTS[c['met']]:<15} {c['check']}")
    return rows
