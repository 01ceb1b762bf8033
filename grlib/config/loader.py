"""Reading params.yaml and resolving a named scale with overrides on top.

    cfg = load_config("smoke", {"model.n_layers": 2, "train": {"lr": 3e-4}})
    cfg = load_config("smoke", '{"model.n_layers": 2}')   # the same mapping as YAML / JSON text
    cfg = load_config("laptop", {}, dataset="ml-100k")    # with ML-100K's own settings (params.yaml `datasets`)
    parse_overrides(["model.d_model=128"])                # the command line's -o KEY=VALUE

A dataset's tuned settings (params.yaml's `datasets` section, e.g. ML-100K's full softmax at
temperature 0.2) are part of the dataset: load_config(..., dataset=NAME) puts them on top of the
scale's and under the overrides (an explicit -o wins). `train --dataset`, `config --dataset` and the
stages that train on a named dataset (ablations train and semi_async: load_ablation fills their
`overrides` from the same section) read them from there.

Overrides may be YAML / JSON text (papermill's `-p overrides '{...}'` passes a string); text that
is not a mapping raises ConfigError naming the parameter. An unknown scale raises ConfigError
listing the valid ones.

All YAML text here (params.yaml, overrides, -o values) is read by grlib.config.values.load_plain:
plain values only (no tags, no aliases, dates kept as their text). A params.yaml that is not valid
YAML, not UTF-8 or holds a tag raises ConfigError "<path>:LINE:COLUMN: <problem>", one line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from grlib import paths
from grlib.config import choices, values
from grlib.config.fields import ConfigError, check, nest
from grlib.config.sections import Config, with_sections


def read_params(path: Path | None = None) -> dict[str, Any]:
    """params.yaml (or `path`) as plain values; ConfigError "<path>:LINE:COLUMN: <problem>" for bytes
    that are not UTF-8, text that is not YAML or YAML that is not a plain value (a tag, an alias)."""
    path = path or paths.params_path()
    try:
        params = values.read_plain_file(Path(path).read_bytes(), str(path))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    except ValueError as err:  # not UTF-8, not YAML, or not a plain value: "<path>:LINE:COLUMN: <problem>"
        raise ConfigError(str(err)) from None
    if not isinstance(params, dict) or "scales" not in params:
        raise ConfigError(f"{path}: expected a mapping with a 'scales' section")
    if not isinstance(params.get("quick", False), bool):
        raise ConfigError(f"{path}: quick must be true or false, got {params['quick']!r}")
    return params


def scale_names(params: dict[str, Any] | None = None) -> list[str]:
    return list((params or read_params())["scales"])


def default_scale(params: dict[str, Any] | None = None) -> str:
    return (params or read_params()).get("scale", "smoke")


def as_mapping(value: Any, name: str, example: str = '{"model.n_layers": 2}') -> dict[str, Any]:
    """`value` as a mapping of overrides: a dict as is, YAML / JSON text parsed ("" / None: empty).
    Anything else raises ConfigError naming the parameter `name`."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            parsed = values.load_plain(value)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = "" if mark is None else f" at column {mark.column + 1}" if mark.line == 0 else \
                f" at line {mark.line + 1}, column {mark.column + 1}"
            problem = (mark is not None and getattr(err, "problem", None)) or values.describe(err, text=value)
            what = "a plain value" if isinstance(err, values.PlainYAMLError) else "valid YAML / JSON"
            raise ConfigError(f"{name}: not {what}{where} ({problem}): {values.shown(value)}") from None
        if parsed is None:
            return {}
        value = parsed
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a mapping such as {example}, got {value!r}")
    return value


def parse_overrides(items: list[str], option: str = "-o") -> dict[str, Any]:
    """Command-line overrides ["model.d_model=128", "train.lr=3e-4"] -> {"model.d_model": 128, ...}
    (values are plain YAML: numbers, true/false, strings, lists; grlib.config.values)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE, e.g. {option} model.d_model=128")
        try:
            out[key.strip()] = values.load_plain(value)
        except values.PlainYAMLError as err:
            raise ConfigError(f"{option} {values.shown(item)}: the value {values.shown(value)} is not a plain value "
                              f"({values.describe(err, text=value)})") from None
        except yaml.YAMLError:
            raise ConfigError(f"{option} {values.shown(item)}: the value {values.shown(value)} "
                              "is not valid YAML") from None
    return out


def check_dataset_overrides(overrides: dict[str, Any], name: str) -> None:
    """Per-dataset config overrides ({dataset: {key: value}}): known datasets, known keys, valid values."""
    check(isinstance(overrides, dict), name, f"expected a mapping such as {{ml-100k: {{negatives.temperature: 0.2}}}}, "
                                             f"got {overrides!r}")
    for ds, o in overrides.items():
        check(ds == "scale" or ds in choices.DATASETS, name,
              f"{ds!r} is not a dataset: one of {('scale', *choices.DATASETS)}")
        check(isinstance(o, dict), f"{name}.{ds}", f"expected a mapping such as {{negatives.temperature: 0.2}}, got {o!r}")
        try:
            with_sections(Config("check"), nest(o))
        except ConfigError as err:
            raise ConfigError(f"{name}.{ds}: {err}") from None


def dataset_section(params: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """params.yaml's `datasets` section, checked: {dataset: {config key: value}} (empty when absent)."""
    section = (params or read_params()).get("datasets") or {}
    check_dataset_overrides(section, "datasets")
    return {name: dict(values or {}) for name, values in section.items()}


def dataset_settings(dataset: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tuned settings of `dataset` (params.yaml `datasets.<dataset>`; empty when it has none)."""
    return dict(dataset_section(params).get(dataset) or {})


def load_config(scale: str | None = None, overrides: dict[str, Any] | str | None = None,
                params: dict[str, Any] | None = None, dataset: str | None = None) -> Config:
    """The Config of a named scale from params.yaml (default: its `scale`) with `overrides`
    (a mapping, or YAML / JSON text of one) applied on top. With `dataset` (a dataset name, or
    "scale": the data.dataset the scale and overrides give), that dataset's settings (params.yaml
    `datasets`) go between the scale's and the overrides; None: none."""
    overrides = as_mapping(overrides, "overrides")
    params = params or read_params()
    scale = scale or default_scale(params)
    scales = params["scales"]
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}; valid scales: {', '.join(scales)}")
    cfg = with_sections(Config(scale=scale), scales[scale] or {})
    if dataset is not None:
        name = cfg.replace(overrides).data.dataset if dataset == "scale" else dataset
        cfg = cfg.replace(dataset_settings(name, params))
    return cfg.replace(overrides)
