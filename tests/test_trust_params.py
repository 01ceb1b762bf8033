"""Values a user hands over as YAML text are plain values (issue 55: notebook parameters, -o
overrides, params.yaml): null, true/false, numbers, strings, lists and mappings with string keys.

A tag (`!!omap`, `!!pairs`, `!!set`, `!!python/...`, any explicit tag) is refused in one line naming
the parameter and the tag, before a kernel starts: papermill writes a value that is not a JSON-like
one (the tuples of `!!omap` / `!!pairs`, a set) into the parameters cell as `"<str(value)>"`, so a
quote inside it ends the string and the rest runs as code. A date stays its text. Each notebook
parameter is checked against the literal default of the notebook's parameters cell. A params.yaml
that is not valid YAML is one line naming file, line and column."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from grlib import config
from grlib.cli import main
from grlib.cli import notebook as notebooks

ROOT = Path(__file__).resolve().parents[1]

PARAMS = ('scale = "smoke"\nanything = None\nname = ""\ncount = 3\nratio = 0.5\nflag = False\n'
          'items = []\nmapping = {}\n')


def _notebook(params: str, cells: list[str]) -> dict:
    def code(i: int, src: str, tags: tuple[str, ...] = ()) -> dict:
        return {"cell_type": "code", "id": f"c{i}", "metadata": {"tags": list(tags)}, "source": src,
                "outputs": [], "execution_count": None}
    return {"cells": [code(0, params, ("parameters",)), *(code(i + 1, s) for i, s in enumerate(cells))],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project root of its own holding notebooks/cheap.ipynb (one cell that prints two parameters)."""
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "grlib").mkdir()
    (root / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    nb = _notebook(PARAMS, ['print("ran", repr(anything), repr(name))'])
    (root / "notebooks" / "cheap.ipynb").write_text(json.dumps(nb))
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(root))
    return root


@pytest.fixture
def executed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The parameters each run_notebook call would hand papermill (no kernel starts)."""
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(notebooks, "_execute", lambda path, out, params: runs.append(dict(params)))
    return runs


def _cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRLIB_PROJECT_ROOT": str(project), "GRLIB_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "grlib", *args], env=env, capture_output=True, text=True,
                          timeout=300, cwd=project)


def _escape(marker: Path) -> str:
    """Python text that creates `marker` when it lands in the parameters cell as code: the string papermill
    writes around the value ends at the first double quote."""
    return f'x"+str(__import__("os").system("touch {marker}"))+"'


def _payloads(marker: Path) -> dict[str, str]:
    code = _escape(marker)
    return {"omap": f"!!omap [{{'{code}': 1}}]",  # a list of (key, value) tuples
            "pairs": f"!!pairs [{{'{code}': 1}}]",
            "set": f"!!set {{'{code}': null}}",
            "python/object/apply:os.system": f'!!python/object/apply:os.system ["touch {marker}"]'}


@pytest.mark.parametrize("tag", ["omap"])
def test_a_tagged_parameter_is_refused_in_one_line_and_runs_nothing(project, tmp_path, tag):
    """The issue's attack, as a user would type it (a fresh process; a kernel would start if it passed)."""
    marker = tmp_path / f"ran-{tag}"
    proc = _cli(project, "notebook", "cheap", "--scale", "smoke", "--output", str(tmp_path / "out.ipynb"),
                "-p", "anything", _payloads(marker)[tag])
    assert not marker.exists(), "the payload ran"
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: parameter anything="), proc.stderr[-2000:]
    assert f"tag !!{tag} is not allowed" in lines[0], lines[0]
    assert not (tmp_path / "out.ipynb").exists()


@pytest.mark.parametrize("tag", ["pairs", "set", "python/object/apply:os.system"])
def test_other_tagged_parameters_are_refused_in_one_line_and_run_nothing(project, tmp_path, capsys, tag):
    marker = tmp_path / "ran"
    out = tmp_path / "out.ipynb"
    assert main(["notebook", "cheap", "--scale", "smoke", "--output", str(out), "-p", "anything",
                 _payloads(marker)[tag]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: parameter anything="), err
    assert f"tag !!{tag} is not allowed" in err, err
    assert not marker.exists() and not out.exists()


def test_every_tag_is_refused_by_the_plain_reader():
    from grlib.config import values

    for text in ["!!omap [{a: 1}]", "!!pairs [{a: 1}]", "!!set {a: null}", "!!binary aGVsbG8=",
                 "!!python/tuple [1, 2]", "!!python/name:os.system", "!!str abc", "!custom 1", "{a: !!float 1}",
                 "[1, !!timestamp 2024-05-01]", "! abc"]:
        with pytest.raises(yaml.YAMLError, match=r"tag !\S* is not allowed") as err:
            values.load_plain(text)
        assert "\n" not in values.describe(err.value), text
    # no mapping key but a string, no aliases (shared or self-containing values), no deep nesting
    for text, problem in [("{1: a}", "key 1 is not a string"), ("{null: a}", "is not a string"),
                          ("[&a [1], *a]", "alias \\*a is not allowed"), ("&a [*a]", "alias"),
                          ("[" * 200 + "]" * 200, "nested deeper than"), ("1" * 5000, "is too large"),
                          ("0x" + "f" * 5000, "is too large")]:
        with pytest.raises(yaml.YAMLError, match=problem):
            values.load_plain(text)
    assert values.load_plain('{"model.n_layers": 2, "seeds": [0, 1], "x": null, "y": .5, "z": yes}') == \
        {"model.n_layers": 2, "seeds": [0, 1], "x": None, "y": 0.5, "z": True}
    assert yaml.safe_load("2024-05-01") != "2024-05-01"  # SafeLoader itself is left as it was


def test_a_date_stays_its_text(project, executed):
    """`-p data 2024-05-01` made a datetime.date: papermill's JSON metadata then raised TypeError."""
    assert main(["notebook", "cheap", "--scale", "smoke", "-p", "name", "2024-05-01",
                 "-p", "anything", "2024-05-01T10:00:00"]) == 0
    assert executed[-1]["name"] == "2024-05-01" and executed[-1]["anything"] == "2024-05-01T10:00:00"
    assert config.parse_overrides(["data.dataset=2024-05-01"]) == {"data.dataset": "2024-05-01"}


def test_a_date_parameter_runs_in_the_kernel_as_a_string(project, tmp_path):
    out = tmp_path / "out.ipynb"
    proc = _cli(project, "notebook", "cheap", "--scale", "smoke", "--output", str(out), "-p", "name", "2024-05-01")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ran None '2024-05-01'" in out.read_text()


@pytest.mark.parametrize("key,value,expected", [
    ("count", "abc", "an integer"), ("count", "true", "an integer"), ("count", "3.5", "an integer"),
    ("count", "2024-05-01", "an integer"),
    ("ratio", "fast", "a finite number"), ("ratio", ".nan", "a finite number"), ("ratio", "[1]", "a finite number"),
    ("name", "5", "a string"), ("name", "[a]", "a string"), ("name", "{a: 1}", "a string"),
    ("items", "{a: 1}", "a list"), ("items", "abc", "a list"),
    ("mapping", "[1]", "a mapping"), ("mapping", "7", "a mapping"),
    ("flag", "2024-05-01", "true or false"),
])
def test_a_parameter_of_the_wrong_type_is_refused_in_one_line(project, executed, capsys, key, value, expected):
    assert main(["notebook", "cheap", "--scale", "smoke", "-p", key, value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: parameter {key}="), err
    assert f"cheap.ipynb expects {expected} (its default is " in err, err
    assert executed == []


def test_the_echoed_value_is_truncated(project, executed, capsys):
    assert main(["notebook", "cheap", "-p", "count", "x" * 5000]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 250 and "xxx..." in err, err
    assert main(["notebook", "cheap", "-p", "anything", "!!omap [" + "a" * 5000 + "]"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300, err


@pytest.mark.parametrize("key,value,parsed", [
    ("count", "7", 7), ("ratio", "2", 2), ("ratio", "1e-3", 1e-3), ("name", "folder/x", "folder/x"),
    ("name", "'5'", "5"), ("items", "[1, b]", [1, "b"]), ("mapping", '{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
    ("flag", "true", True),
    ("anything", "[1, {a: b}]", [1, {"a": "b"}]), ("anything", "text", "text"), ("anything", "null", None),
    ("anything", "2e5", 2e5), ("mapping", "", {}),
])
def test_a_parameter_of_the_right_type_passes(project, executed, key, value, parsed):
    assert main(["notebook", "cheap", "--scale", "smoke", "-p", key, value]) == 0
    assert executed[-1][key] == parsed and type(executed[-1][key]) is type(parsed)


@pytest.mark.parametrize("value,problem", [
    ((1, 2), "tuple"), ({"a": {1, 2}}, "set"), ([object()], "object"), ({1: "a"}, "key 1 is not a string"),
    (b"abc", "bytes"),
])
def test_the_python_api_hands_papermill_only_plain_values(project, executed, value, problem):
    with pytest.raises(notebooks.NotebookError, match=rf"^parameter anything=.*{problem}"):
        notebooks.run_notebook("cheap", "smoke", {"anything": value})
    assert executed == []


def test_the_last_check_before_papermill_refuses_what_is_not_plain(project, tmp_path, monkeypatch):
    import papermill

    monkeypatch.setattr(papermill, "execute_notebook", lambda *a, **k: pytest.fail("papermill was called"))
    nb = project / "notebooks" / "cheap.ipynb"
    with pytest.raises(notebooks.NotebookError, match=r"^parameter anything=\(1,\): .*tuple"):
        notebooks._execute(nb, tmp_path / "o.ipynb", {"scale": "smoke", "anything": (1,)})
    assert list(tmp_path.glob("*.ipynb")) == [] and list(tmp_path.glob(".o.*")) == []


def _dvc_parameters() -> list[tuple[str, dict[str, str]]]:
    """Each DVC stage's notebook and its -p pairs, with ${quick} as DVC renders params.yaml's bool."""
    runs = []
    for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values():
        words = stage["cmd"].split()
        if words[:4] != ["python", "-m", "grlib", "notebook"]:
            continue
        pairs = {words[i + 1]: words[i + 2].replace("${quick}", quick)
                 for quick in ("true", "false") for i, w in enumerate(words) if w == "-p"}
        runs.append((words[4], pairs))
    return runs


def test_every_legitimate_parameter_of_the_project_passes(executed, monkeypatch):
    """The project's notebooks with what DVC, the README and the tests hand them."""
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(ROOT))
    runs = _dvc_parameters()
    assert len(runs) == len(notebooks.notebook_names()) and any(p for _, p in runs)
    for name, pairs in runs:
        notebooks.run_notebook(name, "smoke", pairs)
        for quick in ("True", "false", True):
            if "quick" in pairs:
                notebooks.run_notebook(name, "smoke", {"quick": quick})
    notebooks.run_notebook("02_train", "smoke", {"overrides": '{"model.n_layers": 2}'})  # the docstring's
    notebooks.run_notebook("02_train", "smoke", {"overrides": {"model.n_layers": 2}, "data": "some/folder",
                                                 "ablation_overrides": "seeds: [4, 5]"})
    notebooks.run_notebook("02_train", "smoke", {"overrides": "", "data": "2024-05-01"})
    assert main(["notebook", "02_train", "--scale", "smoke", "-p", "overrides", '{"model.d_model": 32}']) == 0  # README
    assert main(["notebook", "06_semi_async", "--scale", "laptop", "-p", "quick", "false"]) == 0
    assert main(["notebook", "00_data", "--scale", "smoke", "-o", "data.n_users=1000"]) == 0
    assert executed[-1]["overrides"] == {"data.n_users": 1000}


def test_an_override_with_a_tag_is_refused_in_one_line(capsys):
    for value, tag in [("!!omap [{a: 1}]", "!!omap"), ("!!str smoke", "!!str"),
                       ("!!python/object/apply:os.system [true]", "!!python/object/apply:os.system")]:
        assert main(["config", "--scale", "smoke", "-o", f"data.dataset={value}"]) == 2
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("error: -o 'data.dataset=") and "params_hash" not in out, err
        assert f"tag {tag} is not allowed" in err, err
    with pytest.raises(config.ConfigError, match=r"^overrides: not a plain value at column 16 \(the tag !!set"):
        config.load_config("smoke", '{"model.name": !!set {a: null}}')


def _bad_params(tmp_path: Path, old: str, new: str) -> Path:
    root = tmp_path / "project"
    (root / "grlib").mkdir(parents=True)
    text = (ROOT / "params.yaml").read_text()
    assert old in text
    (root / "params.yaml").write_text(text.replace(old, new, 1))
    return root


def test_a_params_yaml_syntax_error_is_one_line_naming_file_line_and_column(tmp_path, monkeypatch, capsys):
    root = _bad_params(tmp_path, "\nquick: false\n", "\nquick: false\n  bad: 1\n")
    line = (root / "params.yaml").read_text().splitlines().index("  bad: 1") + 1
    expected = f"error: {root / 'params.yaml'}:{line}:6: mapping values are not allowed here"
    proc = _cli(root, "config", "--scale", "smoke")
    assert proc.returncode == 2 and proc.stderr == expected + "\n", proc.stderr[-3000:]
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(root))
    for argv in (["config"], ["train", "--scale", "smoke"], ["notebook", "02_train", "--scale", "smoke"]):
        capsys.readouterr()
        (root / "notebooks").mkdir(exist_ok=True)
        (root / "notebooks" / "02_train.ipynb").write_text((ROOT / "notebooks" / "02_train.ipynb").read_text())
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == expected + "\n", argv


def test_a_params_yaml_with_a_tag_or_a_bad_byte_is_one_line(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    root = _bad_params(tmp_path, "\nquick: false\n", f'\nquick: !!python/object/apply:os.system ["touch {marker}"]\n')
    lines = (root / "params.yaml").read_text().splitlines()
    line = next(i for i, s in enumerate(lines, 1) if s.startswith("quick: !!"))
    monkeypatch.setenv("GRLIB_PROJECT_ROOT", str(root))
    with pytest.raises(config.ConfigError, match=rf"^{root / 'params.yaml'}:{line}:8: the tag "
                                                 r"!!python/object/apply:os.system is not allowed"):
        config.read_params()
    assert not marker.exists()
    (root / "params.yaml").write_bytes(b"scale: smoke\nscales:\n  smoke: {}\nnote: caf\xe9\n")
    with pytest.raises(config.ConfigError, match=rf"^{root / 'params.yaml'}:4:10: not UTF-8 text"):
        config.read_params()
    (root / "params.yaml").write_text("scale: smoke\nscales:\n  smoke: {}\nnote: a\x07b\n")
    with pytest.raises(config.ConfigError, match=rf"^{root / 'params.yaml'}:4:8: .*character"):
        config.read_params()
    (root / "params.yaml").write_text("scale: smoke\nscales:\n  smoke: {}\nnote: 2024-05-01\n")
    assert config.read_params()["note"] == "2024-05-01"
