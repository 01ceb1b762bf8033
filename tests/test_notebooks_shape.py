"""Every notebook is a papermill-parameterised, thin notebook: one cell tagged `parameters` whose
defaults run the smoke scale, cell ids present (nbformat 4.5), and every stage of dvc.yaml runs a
notebook that exists."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_a_smoke_parameters_cell(path):
    nb = json.loads(path.read_text())
    tagged = [c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{path.name}: needs exactly one cell tagged 'parameters' (papermill), has {len(tagged)}"
    assert 'scale = "smoke"' in "".join(tagged[0]["source"]), f"{path.name}: parameters must default to smoke"
    missing = [i for i, c in enumerate(nb["cells"]) if "id" not in c]
    assert not missing, f"{path.name}: cells {missing} have no id"


def test_every_stage_runs_an_existing_notebook():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    names = {p.stem for p in NOTEBOOKS}
    for stage, spec in stages.items():
        nb = spec["cmd"].split("notebook ")[1].split()[0]
        assert nb in names, f"stage {stage}: notebook {nb} not in notebooks/"
        assert f"notebooks/{nb}.ipynb" in spec["deps"], f"stage {stage}: its notebook is not a dependency"


def test_runner_refuses_a_notebook_without_parameters(tmp_path, monkeypatch):
    from grlib.cli import notebook as notebooks

    (tmp_path / "notebooks").mkdir()
    (tmp_path / "grlib").mkdir()
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    nb = {"cells": [{"cell_type": "code", "id": "a", "metadata": {}, "source": ["scale = 'smoke'"],
                     "outputs": [], "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "x.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(tmp_path))
    with pytest.raises(ValueError, match="tagged 'parameters'"):
        notebooks.run_notebook("x", "smoke", output=tmp_path / "out.ipynb")
    nb["cells"][0]["metadata"]["tags"] = ["parameters"]
    (tmp_path / "notebooks" / "x.ipynb").write_text(json.dumps(nb))
    with pytest.raises(ValueError, match=r"\['quick'\] are not defined"):
        notebooks.run_notebook("x", "smoke", {"quick": "false"}, output=tmp_path / "out.ipynb")
