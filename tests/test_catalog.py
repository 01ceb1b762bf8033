"""The dataset catalogue (grlib.data.catalog): the scale's own data in data/processed/<scale>, any
other data config in a folder keyed by its settings, reused while they hold, never overwritten by
another config's data."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from grlib.cli import main
from grlib.config import DataConfig, load_config
from grlib.data import catalog, preprocess


def _md5s(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def prepares(monkeypatch) -> list[Path]:
    """The folders prepare_logs wrote during the test, in order."""
    calls: list[Path] = []
    real = preprocess.prepare_logs

    def counted(sources, out, **kw):
        calls.append(Path(out))
        return real(sources, out, **kw)

    monkeypatch.setattr(preprocess, "prepare_logs", counted)
    return calls


def test_an_override_prepares_a_new_folder_and_the_old_one_stays_valid(isolated_outputs, prepares, capsys):
    scale = load_config("smoke")
    own = catalog.ensure_prepared(scale)
    assert own == isolated_outputs / "data" / "processed" / "smoke" and prepares == [own]  # the DVC `data` out
    before = _md5s(own)
    old = catalog.load_dataset(scale)

    # the train command with a data override: a folder of its own, prepared with max_len 16
    out = isolated_outputs / "pop.json"
    assert main(["train", "--scale", "smoke", "--model", "popularity", "-o", "data.max_len=16",
                 "--json", str(out)]) == 0
    short = catalog.folder(load_config("smoke", {"data.max_len": 16}))
    assert prepares == [own, short] and short != own and short.name.startswith("synthetic-")
    stats = json.loads((short / "stats.json").read_text())
    assert stats["max_len"] == 16 and stats["data_key"] == short.name.removeprefix("synthetic-")
    assert json.loads((own / "stats.json").read_text())["max_len"] == scale.data.max_len == 32

    assert _md5s(own) == before  # the scale's folder untouched ...
    again = catalog.load_dataset(scale)  # ... and still the scale's data, loaded without preparing
    assert prepares == [own, short] and again.folder == own
    assert again.data.n_users == old.data.n_users and (again.data.items == old.data.items).all()
    assert json.loads(out.read_text())["test_users"] == catalog.load_dataset(
        load_config("smoke", {"data.max_len": 16})).data.n_users


def test_the_same_config_twice_prepares_once(isolated_outputs, prepares):
    cfg = load_config("smoke", {"data.n_users": 60})
    first = catalog.load_dataset(cfg)
    second = catalog.load_dataset(load_config("smoke", {"data.n_users": 60}))
    assert prepares == [first.folder] and second.folder == first.folder
    assert first.name == "synthetic" and not first.mask_history  # the twin repeats items: no masking
    # a setting that changes the output changes the folder; one that does not (the synthetic
    # generator's seed for a real dataset) keeps it
    assert catalog.folder(load_config("smoke", {"data.n_users": 61})) != first.folder
    assert catalog.folder(load_config("smoke", {"data.bucket_rows": 5000})) != catalog.folder(load_config("smoke"))
    ml = catalog.folder(cfg, "ml-100k")
    assert ml.name.startswith("ml-100k-") and catalog.folder(cfg.replace({"data.seed": 7}), "ml-100k") == ml


def test_an_out_of_date_folder_is_prepared_again(isolated_outputs, prepares):
    cfg = load_config("smoke", {"data.n_users": 60})
    folder = catalog.ensure_prepared(cfg)
    stats = json.loads((folder / "stats.json").read_text())
    (folder / "stats.json").write_text(json.dumps({**stats, "data_key": "0" * 12}))  # e.g. params.yaml changed
    assert catalog.ensure_prepared(cfg) == folder and prepares == [folder, folder]
    assert json.loads((folder / "stats.json").read_text()) == stats


def test_the_key_covers_what_changes_the_prepared_output():
    base = DataConfig(dataset="synthetic")
    for name, value in (("dataset", "ml-100k"), ("max_len", 33), ("min_item_count", 2), ("target", "all"),
                        ("context", "targets"), ("bucket_rows", 5000), ("n_users", 7), ("length_factor", 0.5),
                        ("n_items", 9), ("seed", 1)):
        assert catalog.data_key(dataclasses.replace(base, **{name: value})) != catalog.data_key(base), name
    real = DataConfig(dataset="kuairand-1k")
    for name, value in (("n_users", 7), ("length_factor", 0.5), ("n_items", 9), ("seed", 1)):  # generator only
        assert catalog.data_key(dataclasses.replace(real, **{name: value})) == catalog.data_key(real), name
    assert set(catalog.key_fields(base)) | {"bucket_rows"} >= {f.name for f in dataclasses.fields(DataConfig)}


def test_the_scale_folder_is_params_yaml_data_only(isolated_outputs):
    root = isolated_outputs / "data" / "processed"
    for scale in ("smoke", "laptop", "server", "paper"):
        assert catalog.folder(load_config(scale)) == root / scale
    laptop = load_config("laptop")
    assert catalog.folder(laptop, "ml-100k").parent == root and catalog.folder(laptop, "ml-100k").name != "laptop"
    assert catalog.folder(laptop, "synthetic") == root / "laptop"  # its own dataset by name
    assert catalog.folder(load_config("server", {"data.max_len": 64})).name.startswith("kuairand-1k-")
