"""Pipelines and scaling (claims C5, C7): schedules measured on 2 gloo ranks, the pipeline model, 8 .. 1536 ranks.

Runs the `ablations.scaling` grid of params.yaml (flags override single fields), the scaling
stage's method (grlib.experiments.scaling.stage): sync / prefetch / semisync(k) / overlap /
pipelined(k) on 2 gloo ranks
(per-rank spans, utilisation), the discrete-event model (grlib.sim.pipeline) validated against
those steps, then the paper preset at cluster scale (TurboGR vs the baseline, every parameter in
the rows), 1 vs 2 processes (weak scaling) and one paper-preset layer's MFU, fused vs padded.
Rows go to table `scaling` (ad-hoc unless --record).
"""
from __future__ import annotations

import argparse

from grlib import results
from grlib.bench.common import ablation_from_args, print_table
from grlib.config import config_from_args


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--schedules", nargs="+", default=None, help="measured schedules (registered in grlib.schedules; default: params.yaml's grid)")
    p.add_argument("--ranks", nargs="+", type=int, default=None, help="modelled ranks")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds of the schedules")
    p.add_argument("--pair-steps", type=int, default=None, help="kept steps per run")
    p.add_argument("--quick", action="store_true", help="the reduced grid of the notebook's default")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments.scaling import stage as scaling_stage

    cfg = config_from_args(args)
    names = ["schedules", "ranks", "rounds", "pair_steps"]
    ab = ablation_from_args("scaling", args, names, scaling_stage.quick)
    rows = scaling_stage.measure(cfg, ab)
    table = results.append_rows(scaling_stage.TABLE, rows, cfg)
    for part in scaling_stage.PARTS:
        if part != "spans":
            print_table(scaling_stage.view(table, part).to_dicts(), f"bench pipeline: {part} (scale {cfg.scale})")
    print_table(scaling_stage.acceptance(table).to_dicts(), "acceptance checks (claims C5, C7)")
    return rows
