"""A dataset's own settings (params.yaml `datasets`: one place for `train --dataset`, `config
--dataset` and the train / semi_async stages; an explicit -o wins) and `train --data DIR` on a folder
`data prepare` made (any other folder refused with one line; a test split under 100 users said)."""
from __future__ import annotations

import json

import pytest

from grlib import results
from grlib.cli import main
from grlib.config import ConfigError, dataset_settings, load_ablation, load_config, read_params

PURE = {"log_standard_4_08_to_4_21_pure.csv": "kuairand_pure/log_standard_4_08_to_4_21_pure.SLICE_from_notebook.csv",
        "log_standard_4_22_to_5_08_pure.csv": "kuairand_pure/log_standard_4_22_to_5_08_pure.TAIL5_from_notebook.csv"}


def test_a_datasets_settings_live_in_one_place_and_every_reader_takes_them_from_there():
    params = read_params()
    ml = dataset_settings("ml-100k")
    assert ml == params["datasets"]["ml-100k"] and ml["negatives.softmax"] == "full"
    assert all("overrides" not in (params["ablations"][name] or {}) for name in ("train", "semi_async"))
    assert load_ablation("train").dataset_overrides("ml-100k") == ml
    assert load_ablation("semi_async").overrides["ml-100k"] == ml
    cfg = load_config("laptop", {}, dataset="ml-100k")
    assert (cfg.negatives.softmax, cfg.negatives.temperature, cfg.model.d_model, cfg.train.epochs) == ("full", 0.2, 64, 40)
    assert cfg == load_config("laptop").replace(ml)  # on top of the scale's: the train stage's ML-100K runs
    won = load_config("laptop", {"model.d_model": 32}, dataset="ml-100k")  # an explicit override wins
    assert (won.model.d_model, won.negatives.temperature) == (32, 0.2)
    # "scale" is the scale's own data.dataset (the twin: no settings of its own); None applies none
    assert load_config("laptop", {}, dataset="scale") == load_config("laptop") == load_config("laptop", {}, dataset=None)
    assert load_config("laptop", {"data.dataset": "ml-100k"}, dataset="scale").negatives.softmax == "full"


def test_the_datasets_section_is_checked_and_a_second_place_refused():
    params = read_params()
    bad = {**params, "datasets": {"ml-100k": {"negatives.temp": 0.2}}}
    with pytest.raises(ConfigError, match=r"^datasets.ml-100k: unknown parameter 'negatives.temp'"):
        load_config("smoke", {}, params=bad, dataset="ml-100k")
    with pytest.raises(ConfigError, match=r"^datasets: 'netflix' is not a dataset"):
        load_ablation("train", params={**params, "datasets": {"netflix": {}}})
    twice = {**params, "ablations": {**params["ablations"],
                                     "train": {**params["ablations"]["train"], "overrides": {"ml-100k": {}}}}}
    with pytest.raises(ConfigError, match=r"ablations.train.overrides: a dataset's settings live in params.yaml's "
                                          r"`datasets` section"):
        load_ablation("train", params=twice)


def test_config_shows_a_datasets_settings(capsys):
    assert main(["config", "--scale", "smoke", "--dataset", "ml-100k", "-o", "model.d_model=32"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out[:out.index("params_hash:")])
    assert (shown["negatives"]["temperature"], shown["model"]["d_model"], shown["train"]["epochs"]) == (0.2, 32, 40)
    assert ("dataset ml-100k: its own settings (params.yaml datasets.ml-100k, under -o): negatives.softmax=full "
            "negatives.temperature=0.2 model.d_model=64 train.epochs=40") in out
    assert main(["config", "--scale", "smoke"]) == 0
    assert "dataset synthetic: no settings of its own" in capsys.readouterr().out


def _prepare(args: list[str], capsys) -> dict:
    assert main(["data", "prepare", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_train_on_a_prepared_folder_and_refuse_any_other(isolated_outputs, tmp_path, capsys):
    out = tmp_path / "seqs"
    stats = _prepare(["--dataset", "synthetic", "--scale", "smoke", "--out", str(out), "--n-users", "120",
                      "--max-len", "24"], capsys)
    assert main(["train", "--scale", "smoke", "--data", str(out), "--max-steps", "2", "--json",
                 str(tmp_path / "m.json")]) == 0
    printed = capsys.readouterr().out
    got = json.loads((tmp_path / "m.json").read_text())
    assert got["dataset"] == "synthetic" and got["steps"] == 2 and got["test_users"] == stats["users"] >= 100
    assert "evaluated" not in printed  # 100 users or more: nothing to say

    def refused(argv: list[str], message: str) -> None:
        assert main(["train", "--scale", "smoke", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sequences.parquet").write_bytes((out / "sequences.parquet").read_bytes())
    refused(["--data", str(mine)], f"{mine}: not a folder `data prepare` made (no .grlib-output, vocab.parquet, "
                                   f"stats.json); prepare one with `python -m grlib data prepare")
    refused(["--data", str(tmp_path / "nowhere")], f"{tmp_path / 'nowhere'}: folder not found")
    refused(["--data", str(out), "--dataset", "ml-100k"], "the folder names its dataset; give one of them")
    refused(["--data", str(out), "-o", "data.max_len=8"], "-o data.max_len would not change the prepared folder")
    stats_file = out / "stats.json"
    stats_file.write_text(json.dumps({k: v for k, v in stats.items() if k != "dataset"}))
    refused(["--data", str(out)], f"{stats_file}: not written by `data prepare` (no dataset)")


def test_prepare_then_train_on_the_real_kuairand_pure_slice(real_data, isolated_outputs, tmp_path, capsys):
    raw = tmp_path / "raw"  # the slices under the names of the release's logs, as a user's download has them
    raw.mkdir()
    for name, slice_file in PURE.items():
        (raw / name).write_bytes((real_data / slice_file).read_bytes())
    out = tmp_path / "pure"
    stats = _prepare(["--dataset", "kuairand-pure", "--scale", "smoke", "--raw-dir", str(raw), "--out", str(out),
                      "--max-len", "16"], capsys)
    assert stats["dataset"] == "kuairand-pure" and stats["rows"] == 30
    assert main(["train", "--scale", "smoke", "--data", str(out), "--max-steps", "2", "--json",
                 str(tmp_path / "m.json")]) == 0
    printed = capsys.readouterr().out
    got = json.loads((tmp_path / "m.json").read_text())
    assert got["dataset"] == "kuairand-pure" and got["test_users"] == stats["users"] < 100
    assert f"evaluated {stats['users']} test user" in printed and "(under 100)" in printed


def test_train_names_the_datasets_settings_it_takes_and_an_override_wins(real_data, isolated_outputs, tmp_path,
                                                                          capsys):
    assert main(["train", "--scale", "smoke", "--dataset", "ml-100k", "--max-steps", "1", "-o", "model.d_model=32",
                 "--json", str(tmp_path / "m.json")]) == 0
    err = capsys.readouterr().err
    assert ("dataset ml-100k: its own settings from params.yaml datasets.ml-100k: negatives.softmax=full "
            "negatives.temperature=0.2 train.epochs=40 (-o wins for model.d_model)") in err
    assert json.loads((tmp_path / "m.json").read_text())["dataset"] == "ml-100k"
    row = results.read_table("train_runs", "smoke", adhoc=True).row(-1, named=True)
    want = load_config("smoke", {"model.d_model": 32, "model.name": "hstu", "train.max_steps": 1}, dataset="ml-100k")
    assert row["params_hash"] == want.params_hash()  # the run's whole config: the dataset's settings under the -o


def test_the_train_stage_trains_its_grid_on_a_prepared_folder(isolated_outputs, tmp_path, capsys):
    """notebooks/02_train's `data` parameter: train_stage.run on a folder `data prepare` made."""
    from grlib.experiments import train_stage
    from grlib.schema import DataError

    out = tmp_path / "seqs"
    stats = _prepare(["--dataset", "synthetic", "--scale", "smoke", "--out", str(out), "--n-users", "120",
                      "--max-len", "24"], capsys)
    cfg = load_config("smoke")
    grid = load_ablation("train", {"models": ["hstu"], "seeds": [0], "precisions": ["fp32"]})
    got = train_stage.run(cfg, grid, data=out)
    table = got["table"]
    assert table["dataset"].to_list() == ["synthetic"] and got["skipped"] == {}
    assert table["test_users"].to_list() == [stats["users"]] and 0 < table["steps"][0] <= cfg.train.max_steps
    (tmp_path / "other").mkdir()
    with pytest.raises(DataError, match="not a folder `data prepare` made"):
        train_stage.run(cfg, grid, data=tmp_path / "other")
