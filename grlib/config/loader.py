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
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from grlib import paths
from grlib.config import choices
from grlib.config.fields import ConfigError, check, nest
from grlib.config.sections import Config, with_sections


def read_params(path: Path | None = None) -> dict[str, Any]:
    path = path or paths.params_path()
    with open(path) as fh:
        params = yaml.safe_load(fh)
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
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{name}: not valid YAML / JSON{where} ({problem}): {value!r}") from None
        if parsed is None:
            return {}
        value = parsed
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a mapping such as {example}, got {value!r}")
    return value


def parse_overrides(items: list[str], option: str = "-o") -> dict[str, Any]:
    """Command-line overrides ["model.d_model=128", "train.lr=3e-4"] -> {"model.d_model": 128, ...}
    (values are YAML: numbers, true/false, lists)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE, e.g. {option} model.d_model=128")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"{option} {item!r}: the value {value!r} is not valid YAML") from None
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
