"""Scales and overrides from params.yaml; bad names and values get errors naming the field."""
from __future__ import annotations

import subprocess
import sys

import pytest

from grlib.config import ConfigError, load_ablation, load_config, read_params, scale_names


def test_named_scales_exist_and_load():
    assert scale_names()[:4] == ["smoke", "laptop", "server", "paper"]
    for scale in scale_names():
        cfg = load_config(scale)
        assert cfg.scale == scale
    assert read_params()["scale"] in scale_names()


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
