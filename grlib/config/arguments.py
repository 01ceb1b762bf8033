"""The two options every command that runs at a scale takes, with one wording everywhere:

    --scale NAME          a named scale of params.yaml (default: params.yaml's `scale`)
    -o / --override K=V   a config override on top of it (repeatable; YAML values)

    add_config_arguments(parser)
    cfg = config_from_args(parser.parse_args(), {"model.name": "hstu"})   # fixed fields last
"""
from __future__ import annotations

import argparse
from typing import Any

from grlib.config.loader import load_config, parse_overrides
from grlib.config.sections import Config

SCALE_HELP = "named scale from params.yaml (default: params.yaml's scale)"
OVERRIDE_HELP = "config override, e.g. -o model.d_model=128 -o train.lr=3e-4 (YAML values)"


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scale", default=None, help=SCALE_HELP)
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE", help=OVERRIDE_HELP)


def config_from_args(args: argparse.Namespace, fixed: dict[str, Any] | None = None) -> Config:
    """The Config of args.scale (None: params.yaml's) with the -o overrides, then `fixed` (what the
    command itself sets, e.g. model.name from --model) on top."""
    return load_config(args.scale, {**parse_overrides(args.override), **(fixed or {})})
