"""`dvc repro` at the smoke scale in a git copy of the project (its tracked laptop results
included), `quick: true`: every stage runs, each stage notebook with its own default parameters
(so this is their nbmake run too), tables / figures / executed notebooks appear, a second repro runs
nothing, changing one ablation parameter reruns only the stages that use it (the train rows: each
dataset x model x seed of the grid once, the datasets known from the grid and the stage's skips,
then the new seed's appended), and the laptop outputs, `dvc status` of the laptop pipeline and
`git status` are as before (a smoke run never touches another scale's files)."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

import grlib
from grlib import paths

LAPTOP_OUTPUTS = ("results/summary/laptop.md", "results/figures/laptop/*", "results/metrics/laptop/*",
                  "results/tables/*/scale=laptop/*")


def _copy_repo(src: Path, dst: Path) -> None:
    """The files git tracks or would track (no ignored outputs), and the compiled kernels."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=src,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        if (src / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)
    for ext in Path(grlib.__file__).parent.glob("_C*.so"):  # built, not tracked
        shutil.copy2(ext, dst / "grlib" / ext.name)


def _md5s(root: Path) -> dict[str, str]:
    files = sorted(p for pattern in LAPTOP_OUTPUTS for p in root.glob(pattern) if p.is_file())
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest() for p in files}


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _assert_stage_runs_are_the_defaults(repo: Path, dvc_stages: dict) -> None:
    """Each stage notebook's executed copy ran with its parameters cell's defaults: papermill
    injected no value other than the default. So this run is the notebook's `Run All` as a user
    (or nbmake) runs it, and conftest leaves these notebooks out of nbmake when this test runs."""
    import ast

    from grlib.cli.notebook import literal_assignments, parameter_defaults

    names = [stage["cmd"].split()[4] for stage in dvc_stages.values()]  # python -m grlib notebook NAME ...
    assert sorted(names) == sorted(p.stem for p in (repo / "notebooks").glob("*.ipynb"))  # each notebook a stage, once
    for name in names:
        executed = json.loads((repo / "results" / "executed" / "smoke" / f"{name}.ipynb").read_text())
        injected = [c for c in executed["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
        assert len(injected) == 1, name
        tree = ast.parse("".join(injected[0]["source"]))
        given = literal_assignments(tree)
        assert len(given) == len(tree.body), (name, injected[0]["source"])  # every injected line a literal
        defaults = parameter_defaults(repo / "notebooks" / f"{name}.ipynb")
        assert given and {k: defaults.get(k, "<none>") for k in given} == given, (name, given, defaults)


def _expected_datasets(names: list[str], results: Path, real: Path | None) -> list[str]:
    """The datasets the train stage must have trained, known without its table: the grid's, less those
    it reported skipped (its metrics JSON). Only a real dataset may be skipped, and only where the
    real slices are absent (none beside this checkout: a user's clone, where the download may fail)."""
    from grlib.config import load_config
    from grlib.data.catalog import dataset_config

    cfg = load_config("smoke")
    expected = [dataset_config(cfg, name).dataset for name in names]
    skipped = json.loads((results / "metrics" / "smoke" / "train.json").read_text())["skipped"]
    assert set(skipped) <= set(expected) - {cfg.data.dataset}, skipped  # the scale's own data is never skipped
    if real is not None:
        assert not skipped, skipped
    return [name for name in expected if name not in skipped]


def _keys(train: pl.DataFrame) -> list[tuple]:
    return sorted(train.select("dataset", "model", "seed").iter_rows())


@pytest.mark.slow
def test_dvc_repro_smoke_in_a_copy(tmp_path):
    src = Path(grlib.__file__).resolve().parents[1]
    if not (src / ".git").exists():
        pytest.skip("needs the project's git checkout (the copy holds its tracked and unignored files)")
    repo = tmp_path / "repo"
    _copy_repo(src, repo)
    # grlib's folders and settings are the copy's own, except the machine it emulates (GRLIB_ISA and
    # the GEMM limits it set: grlib.gemm_limits), so that GRLIB_ISA=avx2 make test runs it as an AVX2 CPU,
    # and the session's cache folder (the GEMM library measured once: grlib.ops.gemm_choice)
    keep = ("GRLIB_ISA", "GRLIB_GEMM_LIMITS", "GRLIB_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRLIB_") or k in keep}
    env.update(GRLIB_PROJECT_ROOT=str(repo), PYTHONPATH=str(repo), DVC_NO_ANALYTICS="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    real = paths.real_data_dir()  # the copy has no ../shared beside it: point it at the real slices, if any
    if real is not None:
        env["GRLIB_REAL_DATA"] = str(real)
    dvc = [sys.executable, "-m", "dvc"]
    _run(["git", "init", "-q"], repo, env)
    _run(["git", "add", "-A"], repo, env)
    _run(["git", "commit", "-q", "-m", "copy"], repo, env)
    laptop, laptop_status = _md5s(repo), json.loads(_run(dvc + ["status", "--json"], repo, env).stdout)
    assert laptop and any("scale=laptop" in k for k in laptop) and "results/summary/laptop.md" in laptop

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["scale"] = "smoke"
    params["quick"] = True  # the ablation notebooks' reduced grids: the pipeline is checked, not the grids
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    first = _run(dvc + ["repro"], repo, env).stdout
    dvc_stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    for stage in dvc_stages:
        assert f"Running stage '{stage}'" in first
    _assert_stage_runs_are_the_defaults(repo, dvc_stages)
    results = repo / "results"
    train_parts = results / "tables" / "train" / "scale=smoke"
    assert list(train_parts.glob("*.parquet"))
    assert (results / "figures" / "smoke" / "train_quality.svg").read_text().lstrip().startswith("<svg")
    assert (results / "figures" / "smoke" / "train_quality.png").read_bytes()[:4] == b"\x89PNG"
    assert (results / "executed" / "smoke" / "02_train.ipynb").exists()
    summary = (results / "summary" / "smoke.md").read_text()  # the report reads every stage's table
    assert "measured: kernels run" in summary and "measured: negatives run" in summary and "| C2 " in summary
    train = pl.concat([pl.read_parquet(p) for p in sorted(train_parts.glob("*.parquet"))], how="diagonal_relaxed")
    grid = params["ablations"]["train"]
    datasets = _expected_datasets(grid["datasets"], results, real)
    seeds = list(grid["seeds"])
    runs = sorted(itertools.product(datasets, grid["models"], seeds))  # each (dataset, model, seed) once
    assert set(train["scale"]) == {"smoke"} and _keys(train) == runs

    second = _run(dvc + ["repro"], repo, env).stdout
    assert "Running stage" not in second  # nothing changed: nothing runs (how long that takes is not checked)

    new_seed = max(seeds) + 1
    params["ablations"]["train"]["seeds"] = [*seeds, new_seed]
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = _run(dvc + ["repro"], repo, env).stdout
    assert "Running stage 'train'" in third and "Running stage 'report'" in third
    assert "Running stage 'data'" not in third
    train = pl.concat([pl.read_parquet(p) for p in sorted(train_parts.glob("*.parquet"))], how="diagonal_relaxed")
    rerun = itertools.product(datasets, grid["models"], [*seeds, new_seed])
    assert _keys(train) == sorted([*runs, *rerun])  # appended, not replaced

    assert _md5s(repo) == laptop  # the smoke runs wrote beside the laptop outputs, never over them
    _run(["git", "checkout", "--", "params.yaml", "dvc.lock"], repo, env)  # back to the laptop pipeline
    assert json.loads(_run(dvc + ["status", "--json"], repo, env).stdout) == laptop_status
    assert _run(["git", "status", "--porcelain"], repo, env).stdout == ""
