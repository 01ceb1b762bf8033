"""Test setup: outputs go to a per-session temporary folder, never into the project's data/ or
results/ (notebooks run by nbmake inherit these variables); hypothesis runs without deadlines."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings

import grlib  # noqa: F401  (first: sets the OpenMP wait policy before torch loads, as `python -m grlib` does)

settings.register_profile("grlib", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
# the kernel tests rerun on each non-default instruction-set path (tests/test_isa.py): every test,
# a third of the random cases (the default path runs them all): 20 for a test that takes the
# profile's, and a third of its own for a test with @settings(max_examples=...) (paths_share_of_cases)
PATHS_SHARE = 3
settings.register_profile("paths", parent=settings.get_profile("grlib"), max_examples=60 // PATHS_SHARE)
# HYPOTHESIS_PROFILE=thorough: many more random cases, for a property test under suspicion
settings.register_profile("thorough", parent=settings.get_profile("grlib"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "grlib"))


_SESSION_DIR: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_DIR
    _SESSION_DIR = base = Path(tempfile.mkdtemp(prefix="grlib-test-"))
    # pytest-xdist workers inherit the controller's variables: each worker swaps the controller's
    # folders for its own (no two processes prepare the same dataset in one folder); a folder the
    # user set is kept
    inherited = os.environ.get("GRLIB_TEST_SESSION_DIR")
    for name, sub in (("GRLIB_DATA_DIR", "data"), ("GRLIB_RESULTS_DIR", "results")):
        if name not in os.environ or (inherited and os.environ[name] == str(Path(inherited) / sub)):
            os.environ[name] = str(base / sub)
    os.environ["GRLIB_TEST_SESSION_DIR"] = str(base)
    os.environ.setdefault("GRLIB_PROGRESS", "0")
    # the GEMM library chosen by measurement (grlib.ops.gemm_choice): one record for the whole session,
    # workers included (they inherit the controller's folder), never the user's ~/.cache
    os.environ.setdefault("GRLIB_CACHE_DIR", str(base / "cache"))


DVC_TEST = "tests/test_pipeline.py::test_dvc_repro_smoke_in_a_copy"


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked slow first (otherwise in collection order): with pytest-xdist workers, the
    longest ones then start at once instead of ending the run alone on one worker. And the stage
    notebooks are left out of nbmake when the smoke `dvc repro` test runs them (skip_staged_notebooks)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    skip_staged_notebooks(items)
    if os.environ.get("HYPOTHESIS_PROFILE") == "paths":
        paths_share_of_cases(items)


def paths_share_of_cases(items: list[pytest.Item]) -> None:
    """Under the `paths` profile, a hypothesis test with a case count of its own draws a third of
    it (at least 1), as the tests taking the profile's count do: hypothesis keeps a test's settings
    on the test function (read at each run), the profile's own object where it has none."""
    profile, done = settings.get_profile("paths"), set()
    for item in items:
        fn = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not is_hypothesis_test(fn) or id(fn) in done:  # a parametrized test: once
            continue
        done.add(id(fn))
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None:
            raise RuntimeError(f"{item.nodeid}: hypothesis keeps no settings on the test "
                               "(tests/conftest.py paths_share_of_cases needs another way to scale it)")
        if own is not profile:
            fn._hypothesis_internal_use_settings = settings(own, max_examples=max(1, round(own.max_examples
                                                                                          / PATHS_SHARE)))


def skip_staged_notebooks(items: list[pytest.Item]) -> None:
    """nbmake leaves out the notebooks that DVC stages run when the smoke `dvc repro` test runs in
    this session: that test executes each of them once with its default parameters (it asserts
    papermill injected nothing else), so nbmake would run the same notebook a second time. Run
    alone (`pytest notebooks/`, or -k without that test), nbmake runs every notebook."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() or not any(item.nodeid == DVC_TEST for item in items):
        return  # that test skips without the git checkout, so nbmake keeps every notebook
    import yaml

    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"].values()
    staged = {stage["cmd"].split()[4] for stage in stages}  # python -m grlib notebook NAME ...
    skip = pytest.mark.skip(reason=f"run once with its default parameters as a DVC stage by {DVC_TEST}")
    for item in items:
        if item.path.suffix == ".ipynb" and item.path.stem in staged:
            item.add_marker(skip)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_DIR is not None:
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture
def isolated_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh data/ and results/ for one test."""
    monkeypatch.setenv("GRLIB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GRLIB_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path


@pytest.fixture
def real_data() -> Path:
    """The shared real-data slices; skips (with the reason) when this checkout has none beside it."""
    from grlib import paths

    base = paths.real_data_dir()
    if base is None:
        pytest.skip("real data slices not found (expected shared/data/real beside the checkout, "
                    "or GRLIB_REAL_DATA): a user's clone does not ship them")
    return base


def _dp_smoke(steps: int = 20):
    """The smoke config the data-parallel tests train: `steps` steps of 32 sequences, up to 5 epochs."""
    from grlib.config import load_config

    return load_config("smoke", {"train.max_steps": steps, "train.epochs": 5, "train.batch_size": 32})


@pytest.fixture(scope="session")
def dp_smoke():
    return _dp_smoke


@pytest.fixture(scope="session")
def single_run():
    """One process, one thread, _dp_smoke(20): the losses and metrics that ranks must reproduce."""
    import torch

    from grlib.data.catalog import load_dataset
    from grlib.experiments.train_stage import fit_and_evaluate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = _dp_smoke()
        return fit_and_evaluate(cfg, load_dataset(cfg, "scale"), None)
    finally:
        torch.set_num_threads(threads)
