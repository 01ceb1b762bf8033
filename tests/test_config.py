"""Scales and overrides from params.yaml; bad names and values get errors naming the field."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from grlib.config import ConfigError, load_ablation, load_config, read_params, scale_names


def test_named_scales_exist_and_load():
    assert scale_names()[:4] == ["smoke", "laptop", "server", "paper"]
    for scale in scale_names():
        cfg = load_config(scale)
        assert cfg.scale == scale
    assert read_params()["scale"] in scale_names()


def test_quick_in_params_is_a_bool(tmp_path):
    """params.yaml's `quick` reaches the ablation notebooks as `-p quick ${quick}` (dvc.yaml)."""
    assert read_params()["quick"] is False  # the committed pipeline runs the full grids
    text = (Path(__file__).resolve().parents[1] / "params.yaml").read_text()
    bad = tmp_path / "params.yaml"
    bad.write_text(text.replace("\nquick: false\n", "\nquick: sometimes\n", 1))
    with pytest.raises(ConfigError, match=f"^{bad}: quick must be true or false, got 'sometimes'$"):
        read_params(bad)


def test_unknown_scale_lists_valid_ones():
    with pytest.raises(ConfigError, match="unknown scale 'huge'; valid scales: smoke, laptop, server, paper"):
        load_config("huge")


@pytest.mark.parametrize("override,message", [
    ({"model.n_layer": 2}, "unknown parameter 'model.n_layer'; valid model parameters: name, n_layers"),
    ({"optim": {"lr": 1}}, "unknown section 'optim'; valid top-level sections: data, model, train"),
    ({"train.lr": "fast"}, "train.lr: expected a number, got 'fast'"),
    ({"train.batch_size": 1.5}, "train.batch_size: expected an integer"),
    ({"train.batch_size": 0}, "train.batch_size: must be >= 1"),
    ({"model.d_model": 30, "model.n_heads": 4}, "model.d_model: 30 is not divisible"),
    ({"data.dataset": "netflix"}, "data.dataset: 'netflix' is not one of"),
])
def test_bad_overrides_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config("smoke", override)


def test_overrides_dotted_and_nested_and_hash():
    base = load_config("smoke")
    a = load_config("smoke", {"model.n_layers": 3, "train": {"lr": 3e-4}})
    assert (a.model.n_layers, a.train.lr) == (3, 3e-4)
    assert a.model.d_model == base.model.d_model
    assert a.params_hash() != base.params_hash()
    assert load_config("smoke").params_hash() == base.params_hash()


def test_ablation_is_typed():
    ab = load_ablation("train", {"seeds": [0, 1]})
    assert ab.seeds == [0, 1]
    with pytest.raises(ConfigError, match="unknown ablation 'nope'"):
        load_ablation("nope")
    with pytest.raises(ConfigError, match="ablations.train.models"):
        load_ablation("train", {"models": ["bert4rec"]})


def test_cli_reports_unknown_scale():
    proc = subprocess.run([sys.executable, "-m", "grlib", "config", "--scale", "huge"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "valid scales: smoke, laptop, server, paper" in proc.stderr


def test_overrides_given_as_yaml_or_json_text():
    """papermill's `-p overrides '{"model.n_layers": 2}'` hands the notebook a string."""
    assert load_config("smoke", '{"model.n_layers": 2}').model.n_layers == 2
    assert load_config("smoke", "train: {lr: 3.0e-4}").train.lr == 3e-4
    assert load_config("smoke", "") == load_config("smoke", {}) == load_config("smoke")
    assert load_ablation("train", '{"seeds": [0, 1]}').seeds == [0, 1]
    with pytest.raises(ConfigError, match=r"^overrides: expected a mapping such as .*, got 'abc'$"):
        load_config("smoke", "abc")
    with pytest.raises(ConfigError, match=r"^overrides: not valid YAML / JSON at column 19"):
        load_config("smoke", '{"model.n_layers" 2}')
    with pytest.raises(ConfigError, match=r"^ablation_overrides: expected a mapping .*, got \[0, 1\]$"):
        load_ablation("train", "[0, 1]")
    with pytest.raises(ConfigError, match="unknown parameter 'model.n_layer'"):
        load_config("smoke", '{"model.n_layer": 2}')


def test_cli_config_takes_overrides():
    proc = subprocess.run([sys.executable, "-m", "grlib", "config", "--scale", "smoke", "-o", "model.n_layers=3",
                           "-o", "train.lr=3e-4"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert '"n_layers": 3' in proc.stdout and '"lr": 0.0003' in proc.stdout
    assert load_config("smoke", {"model.n_layers": 3, "train.lr": 3e-4}).params_hash() in proc.stdout


# Commands that build no config, so that -o KEY=VALUE would be ignored: they must not take it (and a
# command that builds one must leave this list). The scale of the files they read, where it is not
# in the files themselves, comes from their own --scale (default: params.yaml's).
NO_CONFIG = {
    "data download": None,  # fetches a dataset's archive: no scale involved
    "claims": "--scale",  # reads the report stage's summary of that scale
    "import-rows": None,  # appends a device check's rows, each with its own scale
    "clean": None,  # removes the leftovers of killed runs: no scale involved
}


def _commands() -> dict[str, "argparse.ArgumentParser"]:
    """Every leaf command of `python -m grlib` ('bench train', 'config', ...) and its parser."""
    import argparse

    from grlib.cli import build_parser

    def walk(parser: argparse.ArgumentParser, prefix: str) -> dict[str, argparse.ArgumentParser]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return {prefix: parser}
        return {k: v for name, sub in subs[0].choices.items() for k, v in walk(sub, f"{prefix} {name}".strip()).items()}

    return walk(build_parser(complete=True), "")


def _takes_scale_and_overrides(parser) -> list[str]:
    from grlib.config.arguments import SCALE_HELP

    options = {opt: a for a in parser._actions for opt in a.option_strings}
    problems = []
    scale = options.get("--scale")
    if scale is None or scale.default is not None or scale.help != SCALE_HELP:
        problems.append("--scale defaulting to params.yaml's scale (grlib.config.add_config_arguments)")
    override = options.get("-o")
    if override is None or not isinstance(override.default, list) or override.dest != "override":
        problems.append("-o KEY=VALUE (repeatable)")
    return problems


def test_the_command_list_is_known():
    assert set(NO_CONFIG) <= set(_commands())


@pytest.mark.parametrize("command", sorted(set(_commands()) - set(NO_CONFIG)))
def test_every_command_takes_scale_and_overrides(command):
    assert _takes_scale_and_overrides(_commands()[command]) == [], command


@pytest.mark.parametrize("command", sorted(NO_CONFIG))
def test_a_command_without_config_takes_no_overrides(command):
    options = {opt: a for a in _commands()[command]._actions for opt in a.option_strings}
    assert "-o" not in options and "--override" not in options, command
    scale = options.get("--scale")
    if NO_CONFIG[command] is None:
        assert scale is None, f"{command} takes --scale: list it as reading files of a scale"
    else:
        assert scale is not None and scale.default is None and "params.yaml" in scale.help, command


def test_the_options_give_the_config():
    import argparse

    from grlib.config import add_config_arguments, config_from_args, default_scale

    p = argparse.ArgumentParser()
    add_config_arguments(p)
    cfg = config_from_args(p.parse_args([]))
    assert cfg == load_config(default_scale())
    cfg = config_from_args(p.parse_args(["--scale", "smoke", "-o", "model.n_layers=3", "-o", "model.name=sasrec"]),
                           {"model.name": "hstu"})
    assert (cfg.scale, cfg.model.n_layers, cfg.model.name) == ("smoke", 3, "hstu")


def test_choice_lists_agree_with_what_implements_them():
    """Each choice list of grlib.config.choices against the registry or table that implements it, and
    the command-line choices that repeat one (until they import it)."""
    from grlib.experiments.kernels_stage import DTYPES as KERNEL_DTYPES
    from grlib.config import choices
    from grlib.data.registry import DATASETS
    from grlib.negatives.samplers import build_sampler
    from grlib.negatives.scoring import DTYPES as PRECISIONS
    from grlib.ops.registry import IMPLS

    assert set(choices.DATASETS) == {"synthetic", *DATASETS}
    assert choices.IMPLS == IMPLS
    assert set(choices.PRECISIONS) == set(PRECISIONS)
    assert set(choices.KERNEL_DTYPES) == set(KERNEL_DTYPES)
    assert [build_sampler(s, 10, np.ones(10)).name for s in choices.SAMPLERS] == list(choices.SAMPLERS)

    cli = {name: {opt: a for a in p._actions for opt in a.option_strings} for name, p in _commands().items()}
    assert tuple(cli["train"]["--model"].choices) == choices.MODELS
    assert tuple(cli["data prepare"]["--dataset"].choices) == choices.DATASETS
    assert tuple(cli["bench kernels"]["--regime"].choices) == choices.REGIMES
    assert set(cli["bench kernels"]["--dtype"].choices) == set(choices.KERNEL_DTYPES)
