"""Every config field has a domain (grlib.config.fields.Rule in its metadata), checked where the
config is built, so `config`, `train`, `bench` and the notebooks refuse the same values with one
line naming the field, the value and the rule (exit 2 at the command line, no traceback).

The walk sets every field of every section (and of DistConfig and every ablation grid) to each of
its rule's out-of-domain values; BOUNDARY, written by hand, holds the first value outside each
numeric section field's domain, so a rule weakened in the code (at_least(1) -> at_least(-5)) fails
here too, not only a check removed."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing

import pytest

from grlib.cli import main
from grlib.config import (ABLATIONS, SECTIONS, ConfigError, DistConfig, choices, load_ablation, load_config,
                          read_params, scale_names)
from grlib.config.fields import CHECKED_BY_SECTION, FLAG, rule_of

CLASSES = {**SECTIONS, **{f"ablations.{n}": c for n, c in ABLATIONS.items()}}
NO_BAD_VALUES = (FLAG, CHECKED_BY_SECTION)  # true/false are typed already; overrides are checked as configs


def _fields(prefix: str):
    return [(prefix, f) for f in dataclasses.fields(CLASSES[prefix])]


ALL_FIELDS = [pf for prefix in CLASSES for pf in _fields(prefix)]
WALK = [(prefix, f.name, bad) for prefix, f in ALL_FIELDS for bad in rule_of(f).bad]


def _numeric(cls, f) -> bool:
    typ = typing.get_type_hints(cls)[f.name]
    inner = typing.get_args(typ)[:1] if typing.get_origin(typ) in (list, tuple) else (typ,)
    return bool(inner) and inner[0] in (int, float)


# the first value outside each numeric field's domain, by hand (not derived from the rules)
BOUNDARY = {
    "data.n_users": 0, "data.length_factor": 0.0, "data.n_items": 1, "data.max_len": 1, "data.min_item_count": 0,
    "data.seed": -1, "data.bucket_rows": 999,
    "model.n_layers": 0, "model.n_heads": 0, "model.d_model": 0, "model.dropout": 1.0,
    "negatives.n_negatives": 0, "negatives.temperature": 0.0, "negatives.queue_depth": 0,
    "train.epochs": 0, "train.batch_size": 0, "train.lr": 0.0, "train.weight_decay": -1e-3, "train.max_steps": -1,
    "train.eval_batch_size": 0, "train.seed": 2**32, "train.warmup_steps": -1, "train.grad_clip": -1e-3,
    "kernels.max_lens": [1], "kernels.pair_budget": 3, "kernels.whole_batch": -1, "kernels.repeats": 0,
    "kernels.row_seconds": 0.0,
    "dist.world": 0, "dist.nodes": 0, "dist.staleness": -1, "dist.timeout_s": 0.0, "dist.quadratic": [float("nan")],
    "dist.bucket_bytes": 0,
}


def _yaml(value) -> str:
    """`value` as the text of -o KEY=VALUE (YAML)."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ("-" if value < 0 else "") + ".inf"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def _one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert "params_hash" not in out, out  # refused, not printed
    return lines[0]


def test_every_field_declares_a_rule_its_default_keeps():
    for prefix, f in ALL_FIELDS:
        rule = rule_of(f)
        assert rule is not None, f"{prefix}.{f.name} declares no rule"
        assert rule in NO_BAD_VALUES or rule.bad, f"{prefix}.{f.name}: its rule lists no value outside it"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert rule.holds(default), f"{prefix}.{f.name}: the default {default!r} breaks {rule.text}"
        assert not any(rule.holds(b) for b in rule.bad), f"{prefix}.{f.name}: a 'bad' value lies inside"


def test_the_boundary_table_covers_every_numeric_section_field():
    numeric = {f"{p}.{f.name}" for p, f in ALL_FIELDS if not p.startswith("ablations.") and _numeric(CLASSES[p], f)}
    assert numeric == set(BOUNDARY)


# params.yaml's ML-100K settings (d_model 64) at the paper scale's 12 heads: 64 is not divisible by 12
# (the paper scale is declared, never run here; the check that refuses it predates the domains)
# the paper's 12 heads (paper, and paper-cpu: its model on one CPU, for bench train) cannot take ML-100K's d = 64
KNOWN_CLASHES = {(scale, grid, "ml-100k"): "model.d_model: 64 is not divisible by model.n_heads=12"
                 for scale in ("paper", "paper-cpu") for grid in ("train", "semi_async")}


def test_every_scale_and_every_ablation_grid_lies_inside_the_domains():
    """No domain refuses a value params.yaml uses: every scale, every grid, and each grid's
    per-dataset overrides and precisions on top of every scale."""
    clashes = {}
    for scale in scale_names():
        cfg = load_config(scale)
        for name in ABLATIONS:
            ab = load_ablation(name)
            for ds in getattr(ab, "datasets", ()):
                overrides = ab.dataset_overrides(ds) if hasattr(ab, "dataset_overrides") else \
                    dict(getattr(ab, "overrides", {}).get(ds) or {})
                try:
                    cfg.replace(overrides)
                except ConfigError as err:
                    clashes[(scale, name, ds)] = str(err)
            for p in getattr(ab, "precisions", ()):
                cfg.replace({"model.name": "hstu", "model.precision": p})
    assert clashes == KNOWN_CLASHES
    assert set(read_params()["ablations"]) <= set(ABLATIONS)


@pytest.mark.parametrize("key", sorted(BOUNDARY))
def test_the_first_value_outside_each_numeric_field_is_refused(key, capsys):
    prefix, name = key.rsplit(".", 1)
    bad = BOUNDARY[key]
    assert main(["config", "--scale", "smoke", "-o", f"{key}={_yaml(bad)}"]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {key}: "), line


@pytest.mark.parametrize("prefix,name,bad", [w for w in WALK if not w[0].startswith("ablations.")],
                         ids=lambda v: _yaml(v) if not isinstance(v, str) else v)
def test_every_section_field_refuses_each_out_of_domain_value_at_the_cli(prefix, name, bad, capsys):
    """`python -m grlib config -o FIELD=VALUE` (the loader train, bench and the notebooks share)."""
    assert main(["config", "--scale", "smoke", "-o", f"{prefix}.{name}={_yaml(bad)}"]) == 2
    line = _one_error_line(capsys)
    rule = rule_of(next(f for f in dataclasses.fields(CLASSES[prefix]) if f.name == name))
    assert line == f"error: {prefix}.{name}: {rule.error(bad)}", line


@pytest.mark.parametrize("prefix,name,bad", [w for w in WALK if w[0].startswith("ablations.")],
                         ids=lambda v: _yaml(v) if not isinstance(v, str) else v)
def test_every_grid_field_refuses_each_out_of_domain_value(prefix, name, bad):
    with pytest.raises(ConfigError) as err:
        load_ablation(prefix.split(".", 1)[1], {name: bad})
    assert str(err.value).startswith(f"{prefix}.{name}: ") and "\n" not in str(err.value), err.value


@pytest.mark.parametrize("overrides,message", [
    ({"model.d_model": 30, "model.n_heads": 4}, "model.d_model: 30 is not divisible by model.n_heads=4"),
    ({"model.name": "sasrec", "model.precision": "bf16"}, "model.precision: bf16 is implemented for model.name=hstu"),
    ({"model.dropout": ".nan"}, "model.dropout: must be in [0, 1), got nan"),
    ({"train.lr": ".inf"}, "train.lr: must be > 0 and finite, got inf"),
    ({"data.dataset": "netflix"}, "data.dataset: 'netflix' is not one of ('synthetic', "),
    ({"kernels.max_lens": "[]"}, "kernels.max_lens: needs at least 1 value, got []"),
])
def test_cross_field_and_special_values_are_one_line(overrides, message, capsys):
    argv = ["config", "--scale", "smoke"]
    for k, v in overrides.items():
        argv += ["-o", f"{k}={v}"]
    assert main(argv) == 2
    assert _one_error_line(capsys).startswith(f"error: {message}")


@pytest.mark.parametrize("kwargs,message", [
    ({"world": 4, "nodes": 3}, "dist.nodes: must divide dist.world=4"),
    ({"staleness": 2}, "dist.staleness: must be 0 unless dist.schedule is 'semisync' or 'pipelined'"),
    ({"dedup": "node"}, "dist.dedup: 'node' de-duplicates inside the two-stage exchange"),
    ({"quadratic": (1.0, 2.0, 3.0)}, "dist.quadratic: (c0, a, b) of dist.cost='quadratic' (empty: calibrated"),
    ({"cost": "quadratic", "quadratic": (1.0, 2.0)}, "dist.quadratic: (c0, a, b) of dist.cost='quadratic'"),
    ({"world": "2"}, "dist.world: must be >= 1, got '2'"),  # built directly (a notebook): the type too
])
def test_run_options_cross_checks(kwargs, message):
    with pytest.raises(ConfigError) as err:
        DistConfig(**kwargs)
    assert str(err.value).startswith(message)


def test_train_refuses_a_bad_run_option_before_starting_ranks(capsys):
    # --staleness is a run flag, not a config field: argparse refuses it (exit 2) before any rank starts
    with pytest.raises(SystemExit) as exc:
        main(["train", "--scale", "smoke", "--world", "2", "--staleness", "-1", "--schedule", "semisync"])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1].endswith("error: argument --staleness: must be >= 0, got -1"), err
    assert "Traceback" not in err and "params_hash" not in out


def test_the_choice_lists_name_what_the_library_implements():
    from grlib.distributed.balance import METHODS
    from grlib.sim.alltoall import PRESETS
    from grlib.sim.scaleout import DEVICES

    assert choices.BALANCERS == METHODS  # one name per balancer, from --balance to the planner
    assert choices.PRESETS == tuple(PRESETS) and choices.DEVICES == tuple(DEVICES)
    assert set(choices.SHARDED_ITEMS) < set(choices.ITEM_SHARDING)


@pytest.mark.parametrize("argv", [
    ["config", "--scale", "smoke", "-o", "model.d_model=-3"],
    ["train", "--scale", "smoke", "-o", "model.d_model=-3"],
    ["bench", "kernels", "--scale", "smoke", "-o", "kernels.repeats=0"],
])
def test_the_real_commands_exit_2_with_one_line(argv):
    proc = subprocess.run([sys.executable, "-m", "grlib", *argv], capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "params_hash" not in proc.stdout
    assert lines[0] in ("error: model.d_model: must be >= 1, got -3", "error: kernels.repeats: must be >= 1, got 0")
