"""Typed configuration: one dataclass per section, loaded from a named scale in params.yaml.

params.yaml holds `scale` (the default scale of `dvc repro` and of every command), `scales`
(smoke, laptop, server, paper: each a dict of sections), `datasets` (a dataset's own settings,
applied where it is chosen: load_config(..., dataset=NAME)) and `ablations` (the grids each
experiment sweeps). A notebook loads a scale and overrides single fields from its parameters cell:

    cfg = load_config("smoke", {"model.n_layers": 2, "train": {"lr": 3e-4}})
    cfg = load_config("smoke", '{"model.n_layers": 2}')   # the same mapping as YAML / JSON text
    ab = load_ablation("train", {"seeds": [0, 1]})

Unknown scales, sections or fields raise ConfigError listing the valid ones; a value of the wrong
type or outside its field's domain raises ConfigError naming the field, the value and the rule.
Every field declares its domain with its default (fields.param), checked where the dataclass is
built: `config`, `train`, `bench` and the notebooks refuse the same values.

    choices     every choice list (datasets, models, samplers, precisions, ...), written once
    fields      ConfigError, each field's domain (Rule, param, check_fields), type-checked application
                of values to a dataclass
    sections    DataConfig, ModelConfig, NegativesConfig, TrainConfig, KernelsConfig, Config;
                DistConfig (run options of data-parallel training, not a scale's section)
    loader      read_params, load_config, overrides (mappings, YAML / JSON text, -o KEY=VALUE)
    values      load_plain: the one YAML reader (params.yaml, overrides, -p values), plain values only
                (no tags, aliases or non-string keys; dates kept as text); describe, plain_problem
    ablations   TrainAblation, KernelsAblation, NegativesAblation, BalanceAblation, SparseAblation,
                SemiAsyncAblation, ScalingAblation, load_ablation
    arguments   --scale and -o for a command's parser, and the Config they give
"""
from grlib.config import choices
from grlib.config.ablations import (ABLATIONS, BalanceAblation, KernelsAblation, NegativesAblation, ScalingAblation,
                                    SemiAsyncAblation, SparseAblation, TrainAblation, load_ablation)
from grlib.config.arguments import add_config_arguments, config_from_args
from grlib.config.fields import ConfigError
from grlib.config.loader import (as_mapping, dataset_section, dataset_settings, default_scale, load_config,
                                 parse_overrides, read_params, scale_names)
from grlib.config.sections import (SECTIONS, Config, DataConfig, DistConfig, KernelsConfig, ModelConfig, NegativesConfig,
                                   TrainConfig)

__all__ = [
    "ABLATIONS", "SECTIONS", "BalanceAblation", "Config", "ConfigError", "DataConfig", "DistConfig", "KernelsAblation",
    "KernelsConfig", "ModelConfig", "NegativesAblation", "NegativesConfig", "ScalingAblation", "SemiAsyncAblation", "SparseAblation",
    "TrainAblation", "TrainConfig", "add_config_arguments", "as_mapping", "choices", "config_from_args",
    "dataset_section", "dataset_settings",
    "default_scale", "load_ablation", "load_config", "parse_overrides", "read_params", "scale_names",
]
