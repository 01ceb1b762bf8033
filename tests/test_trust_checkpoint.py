"""Checkpoints are data, never code: a pickled payload in a checkpoint folder is refused in one line
naming the file and what it asked for, and runs nothing; the checkpoints grlib writes still load.

The payloads are the classic ones: an object whose __reduce__ returns os.system or builtins.exec
with a command that creates a marker file. Each test asserts the marker is absent afterwards, and
test_the_payloads_are_live shows that an unrestricted unpickler would have created it (so the
absence means something). Formats: torch.save's zip (what grlib writes), torch.save's legacy
format, and a plain pickle (what `pickle.dump` makes, protocol 5).
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import pickle
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from grlib.train import checkpoint


class _System:
    """Unpickling calls os.system("touch MARKER") (pickled as posix.system)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


class _Exec:
    """Unpickling calls exec("open(MARKER, 'w').close()") (pickled as builtins.exec)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


PAYLOADS = {"os.system": (_System, "posix.system"), "builtins.exec": (_Exec, "builtins.exec")}


def _write(path: Path, fmt: str, payload: Any) -> None:
    """A checkpoint-shaped dict with the payload inside (as a planted last.pt would be)."""
    state = {"format": checkpoint.FORMAT, "position": {"step": 3}, "model": payload}
    if fmt == "zip":
        torch.save(state, path)
    elif fmt == "legacy":
        torch.save(state, path, _use_new_zipfile_serialization=False)
    else:  # a plain pickle (protocol 5: FRAME and STACK_GLOBAL opcodes, not torch's)
        path.write_bytes(pickle.dumps(state, protocol=5))


@pytest.mark.parametrize("fmt", ["zip", "legacy", "plain"])
def test_the_payloads_are_live(tmp_path, fmt):
    """The control: an unrestricted unpickler runs each payload (what `weights_only=False` did)."""
    for name, (cls, _) in PAYLOADS.items():
        marker = tmp_path / f"ran-{name}"
        _write(tmp_path / "last.pt", fmt, cls(marker))
        with open(tmp_path / "last.pt", "rb") as fh:
            torch.load(fh, weights_only=False) if fmt != "plain" else pickle.load(fh)
        assert marker.exists(), name


@pytest.mark.parametrize("fmt", ["zip", "legacy", "plain"])
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_load_refuses_a_payload_in_one_line_and_runs_nothing(tmp_path, monkeypatch, fmt, name):
    # a careless environment cannot turn the guard off (torch honours it only where weights_only is not given)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    cls, refused = PAYLOADS[name]
    marker = tmp_path / "pwned"
    path = tmp_path / "last.pt"
    _write(path, fmt, cls(marker))
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load(path)
    message = str(info.value)
    assert not marker.exists()
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith(f"{path}: ") and refused in message, message
    assert "nothing in it ran" in message, message
    assert not isinstance(info.value, checkpoint.CheckpointMismatch)  # refused before any comparison


def test_a_refused_name_is_echoed_escaped_and_cut_at_once(tmp_path):
    """The global's name comes from the file: its control bytes are escaped, a long one is cut, and
    refused before torch reads it (torch's message for a 100 KB name took 4 minutes: its regex is
    quadratic in the name's length)."""
    path = tmp_path / "last.pt"
    for raw, shown in ((b"\x80\x02cposix\nsys\x1b[2Jtem\n)R.", "posix.sys\\x1b[2Jtem"),
                       (b"\x80\x02cbuiltins\n" + b"e" * 100_000 + b"\n)R.", "builtins." + "e" * 191 + "...")):
        path.write_bytes(raw)
        start = time.monotonic()
        with pytest.raises(checkpoint.CheckpointRefused) as info:
            checkpoint.load(path)
        assert time.monotonic() - start < 10  # (0.01 s here; the quadratic message: 243 s)
        assert f"it asks for {shown}, which" in str(info.value) and len(str(info.value)) < 500, str(info.value)[:300]


def test_vet_refuses_without_reading_tensors(tmp_path):
    """vet (what a launcher runs on its ranks' files before starting them) refuses the same files
    in the same line, and passes a checkpoint grlib wrote."""
    marker = tmp_path / "pwned"
    for fmt in ("zip", "legacy", "plain"):
        path = tmp_path / f"last.rank1-of-2.{fmt}.pt"
        _write(path, fmt, _System(marker))
        with pytest.raises(checkpoint.CheckpointError, match="posix.system"):
            checkpoint.vet(path)
    assert not marker.exists()
    good = tmp_path / "good.pt"
    checkpoint.save(good, {"model": collections.OrderedDict(w=torch.ones(2))})
    checkpoint.vet(good)


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    """The smoke scale's dataset, prepared once in a data folder of this module's."""
    from grlib.config import load_config
    from grlib.data.catalog import load_dataset

    data_dir = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRLIB_DATA_DIR", str(data_dir))
        load_dataset(load_config("smoke"))
        yield data_dir


def _cli(args: list[str], data_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GRLIB_DATA_DIR": str(data_dir), "GRLIB_RESULTS_DIR": str(tmp_path / "results"),
           "OMP_NUM_THREADS": "1", "GRLIB_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "grlib", "train", "--scale", "smoke", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("planted, world", [("last.pt", []),
                                            ("last.rank1-of-2.pt", ["--world", "2", "--items", "flat"])],
                         ids=["last.pt", "rank-file"])
def test_train_refuses_a_planted_payload_in_one_line(smoke_data, tmp_path, planted, world):
    """`train --checkpoint-dir DIR` with a payload as DIR's checkpoint: exit 2, one `error:` line
    naming the file and the refused global, the payload's side effect absent, no row written."""
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    _write(ckpt / planted, "zip", _System(marker))
    got = _cli(["--max-steps", "2", "--checkpoint-dir", str(ckpt), *world], smoke_data, tmp_path)
    assert not marker.exists()
    lines = got.stderr.strip().splitlines()
    assert got.returncode == 2 and len(lines) == 1, (got.returncode, got.stderr)
    assert lines[0].startswith(f"error: {ckpt / planted}: ") and "posix.system" in lines[0], lines[0]
    assert not list((tmp_path / "results").rglob("*.parquet"))  # nothing trained, no row


def _kinds(value: Any, out: set[str]) -> set[str]:
    """The type names a loaded checkpoint holds, recursively."""
    out.add(type(value).__name__)
    if isinstance(value, dict):
        for k, v in value.items():
            _kinds(k, out), _kinds(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _kinds(v, out)
    return out


DATA = {"dict", "OrderedDict", "list", "tuple", "int", "float", "str", "bool", "NoneType", "Tensor"}


@pytest.mark.parametrize("settings", [{"model.name": "hstu"},
                                      {"model.name": "sasrec", "negatives.async_sampling": True}],
                         ids=["hstu", "sasrec-async"])
def test_a_real_checkpoint_loads_and_resumes(smoke_data, tmp_path, monkeypatch, settings):
    """What the training loop writes (a validated epoch's best weights included) is data only (the
    types above), loads with weights_only and resumes."""
    from grlib.config import load_config
    from grlib.data.catalog import load_dataset
    from grlib.fit import resume_identity
    from grlib.model import build_model
    from grlib.train import train

    monkeypatch.setenv("GRLIB_DATA_DIR", str(smoke_data))
    cfg = load_config("smoke", {**settings, "train.select_best": True})
    ds = load_dataset(cfg)
    ckpt = tmp_path / "ck"

    def run(steps: int):
        torch.manual_seed(0)
        model = build_model(cfg.model, ds.data.n_items, cfg.data.max_len)
        return train(model, ds.data, dataclasses.replace(cfg.train, max_steps=steps), cfg.data.max_len,
                     cfg.negatives, validate=lambda m: {"ndcg@10": 0.25}, checkpoint_dir=ckpt, checkpoint_every=1,
                     identity=resume_identity(cfg, ds.name))

    run(2)
    state = checkpoint.load(ckpt / "last.pt")
    assert _kinds(state, set()) <= DATA, _kinds(state, set()) - DATA
    assert state["position"]["step"] == 2 and len(state["losses"]) == 2
    assert state["best"]["state"] is not None  # the validated (cut) epoch's weights: tensors
    resumed = run(3)
    assert resumed.resumed_from == 2 and resumed.steps == 3
    assert checkpoint.load(ckpt / "last.pt")["position"]["step"] == 3
def test_a_state_shaped_like_a_real_one_round_trips(tmp_path):
    """Tensors, an OrderedDict, a tuple (Adam's betas), None, -inf, a numpy PCG64 state (ints past
    64 bits) and nested lists: saved and loaded as they were."""
    rng_state = np.random.default_rng(7).bit_generator.state
    state = {
        "model": collections.OrderedDict(w=torch.randn(3, 4), b=torch.zeros(4, dtype=torch.bfloat16)),
        "optimizers": {"dense": {"state": {0: {"step": torch.tensor(2.0), "exp_avg": torch.ones(3)}},
                                 "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.98), "params": [0], "foreach": None}]}},
        "negatives": {"state_dict": {"generator": torch.Generator().manual_seed(3).get_state()}},
        "position": {"step": 5, "epoch": 0, "batch": 5, "epoch_rng": rng_state},
        "torch_rng": torch.get_rng_state(), "losses": [1.5, 1.25], "val_history": [], "best_epoch": -1,
        "best": {"state": None, "metric": -math.inf},
    }
    path = tmp_path / "last.pt"
    checkpoint.save(path, state)
    got = checkpoint.load(path)
    assert got["format"] == checkpoint.FORMAT
    assert type(got["model"]) is collections.OrderedDict
    assert got["optimizers"]["dense"]["param_groups"][0]["betas"] == (0.9, 0.98)
    assert got["position"]["epoch_rng"] == rng_state
    assert got["best"] == {"state": None, "metric": -math.inf}
    for key in ("w", "b"):
        assert torch.equal(got["model"][key], state["model"][key])
        assert got["model"][key].dtype == state["model"][key].dtype
    assert torch.equal(got["torch_rng"], state["torch_rng"])
