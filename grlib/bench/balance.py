"""Load balancing across data-parallel ranks (claim C2): calibrate, simulate at cluster scale, measure.

Runs the `ablations.balance` grid of params.yaml (flags override single fields), the balance
stage's method (grlib.experiments.balance_stage): one HSTU layer calibrated on this machine
(c0 + a*s + b*s^2, R^2), imbalance (max - min) / max of every ranks x users x max_len cell simulated
on KuaiRand-27K lengths with the fitted costs (model, and under the measured residuals), the
time-sliced shares of emulated ranks measured one after another, and two gloo ranks training
with balance none vs the balancer. `random` is the baseline of every ratio, run in the same
invocation. Rows go to table `balance` (ad-hoc unless --record).
"""
from __future__ import annotations

import argparse

from grlib import results
from grlib.bench.common import ablation_from_args, print_table
from grlib.config import config_from_args
from grlib.config.choices import BALANCE_PARTS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", nargs="+", default=list(BALANCE_PARTS), choices=BALANCE_PARTS,
                   help="parts to run (calibrate always runs: the others use its fit)")
    p.add_argument("--ranks", nargs="+", type=int, default=None, help="simulated ranks")
    p.add_argument("--users-per-rank", nargs="+", type=int, default=None)
    p.add_argument("--max-lens", nargs="+", type=int, default=None)
    p.add_argument("--methods", nargs="+", default=None, help="balancers (random is the baseline)")
    p.add_argument("--sim-steps", type=int, default=None)
    p.add_argument("--pair-steps", type=int, default=None, help="training steps of each 2-process run")
    p.add_argument("--quick", action="store_true", help="the reduced grid of the notebook's default (seconds)")


def run(args: argparse.Namespace) -> list[dict]:
    from grlib.experiments import balance_stage

    cfg = config_from_args(args)
    names = ["ranks", "users_per_rank", "max_lens", "methods", "sim_steps", "pair_steps"]
    ab = ablation_from_args("balance", args, names, balance_stage.quick)
    rows, cost = balance_stage.measure(cfg, ab, tuple(args.parts))
    table = results.append_rows(balance_stage.TABLE, rows, cfg)
    fit = ", ".join(f"{k}={v:.4g}" for k, v in cost.params().items())
    for part in args.parts:
        view = balance_stage.view(table, part)
        print_table(view.to_dicts(), f"bench balance: {part} (scale {cfg.scale}, HSTU layer d={cfg.model.d_model} "
                                     f"heads={cfg.model.n_heads}; cost model {fit})")
    print_table(balance_stage.acceptance(table).to_dicts(), "acceptance checks (claim C2)")
    return rows
