"""One error style: a user mistake prints one line `error: ...` on stderr and exits 2, no traceback:
corrupt or truncated checkpoints (the file named), resuming with another model or settings (what
differs named), bad overrides and environment settings, output folders grlib did not make."""
from __future__ import annotations

import importlib.util
import shutil

import pytest

from grlib.cli import main
from grlib.train import checkpoint

TRAIN = ["train", "--scale", "smoke", "--max-steps", "1"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Outputs (data prepared once) and a smoke HSTU checkpoint after one step."""
    base = tmp_path_factory.mktemp("errors")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRLIB_DATA_DIR", str(base / "data"))
        mp.setenv("GRLIB_RESULTS_DIR", str(base / "results"))
        assert main([*TRAIN, "--checkpoint-dir", str(base / "ckpt")]) == 0
    return base


@pytest.fixture
def ckpt(trained, tmp_path, monkeypatch):
    """A copy of the checkpoint folder, with the module's data and results folders."""
    monkeypatch.setenv("GRLIB_DATA_DIR", str(trained / "data"))
    monkeypatch.setenv("GRLIB_RESULTS_DIR", str(trained / "results"))
    shutil.copytree(trained / "ckpt", tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_corrupt_and_truncated_checkpoints_name_the_file(ckpt, capsys):
    capsys.readouterr()
    path = ckpt / "last.pt"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # truncated (a copy cut short)
    assert main([*TRAIN, "--checkpoint-dir", str(ckpt)]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {path}: corrupt or truncated checkpoint (")
    path.write_bytes(b"not a checkpoint at all\n")
    assert main([*TRAIN, "--checkpoint-dir", str(ckpt)]) == 2
    assert f"{path}: corrupt or truncated checkpoint" in _one_error_line(capsys)
    with pytest.raises(checkpoint.CheckpointError, match="corrupt or truncated"):
        checkpoint.load(path)
    checkpoint.save(path, {"something": 1})
    checkpoint.load(path)
    (ckpt / "other.pt").write_bytes(b"")
    with pytest.raises(checkpoint.CheckpointError, match="other.pt: corrupt or truncated"):
        checkpoint.load(ckpt / "other.pt")


@pytest.mark.parametrize("extra,differs", [
    (["--model", "sasrec"], "model.name='hstu' in the checkpoint, 'sasrec' here"),
    (["-o", "model.d_model=32"], "model.d_model=64 in the checkpoint, 32 here"),
    (["-o", "negatives.n_negatives=32"], "negatives.n_negatives=64 in the checkpoint, 32 here"),
    (["-o", "train.lr=0.01"], "train.lr=0.001 in the checkpoint, 0.01 here"),
    (["--dataset", "synthetic", "-o", "data.n_items=400"], "data.n_items=500 in the checkpoint, 400 here"),
])
def test_resuming_another_run_names_what_differs(ckpt, capsys, extra, differs):
    assert main([*TRAIN, "--checkpoint-dir", str(ckpt), *extra]) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {ckpt / 'last.pt'} was written by another run: ") and differs in line, line


def test_resume_may_switch_async_sampling_and_says_so(ckpt, capsys):
    """Async sampling draws the sync path's ids, so a checkpoint resumes with it on or off."""
    assert main(["train", "--scale", "smoke", "--max-steps", "2", "--checkpoint-dir", str(ckpt),
                 "-o", "negatives.async_sampling=true"]) == 0
    assert f"resuming from {ckpt / 'last.pt'} at step 1" in capsys.readouterr().err


def test_model_of_another_shape_is_refused_without_settings(ckpt, tmp_path):
    """The library check (no settings given): parameter shapes are compared before loading."""
    import torch

    from grlib.config import load_config
    from grlib.data.catalog import load_dataset
    from grlib.model import build_model
    from grlib.train import train

    cfg = load_config("smoke")
    ds = load_dataset(cfg)
    train(build_model(cfg.model, ds.data.n_items, 32), ds.data, cfg.train, 32, cfg.negatives,
          checkpoint_dir=tmp_path / "c")
    other = cfg.replace({"model.n_layers": 2}).model
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"model parameter layers\.1\..*absent in the "
                                                            r"checkpoint, shape \[\d+.*\] here"):
        train(build_model(other, ds.data.n_items, 32), ds.data, cfg.train, 32, cfg.negatives,
              checkpoint_dir=tmp_path / "c")
    assert torch.is_tensor(checkpoint.load(tmp_path / "c" / "last.pt")["torch_rng"])


@pytest.mark.parametrize("argv,message", [
    (["train", "--scale", "smoke", "-o", "model.d_model"], "error: -o 'model.d_model': expected KEY=VALUE"),
    (["train", "--scale", "smoke", "-o", "train.lr=["], "error: -o 'train.lr=[': the value '[' is not valid YAML"),
    (["config", "--scale", "smoke", "-o", "model.depth=3"], "error: unknown parameter 'model.depth'"),
    (["train", "--scale", "smoke", "-o", "model.d_model=-3"], "error: model.d_model: must be >= 1, got -3"),
    # a known implementation HSTU attention lacks (or, as triton without triton, cannot load): refused when
    # the model is built, before any step, not by a traceback from inside the first forward
    ([*TRAIN, "-o", "model.attention_impl=onednn"], "error: model.attention_impl: 'onednn' cannot run here: "
                                                    "hstu_attention: implementation 'onednn' is not available"),
    pytest.param([*TRAIN, "-o", "model.attention_impl=npu"],
                 "error: model.attention_impl: 'npu' cannot run here: the 'npu' implementation needs torch-npu",
                 marks=pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None,
                                          reason="torch_npu is installed: the npu implementation loads here")),
    # inside its domain, but the data leave no item: refused where the vocabulary is built
    ([*TRAIN, "-o", "data.min_item_count=100000"], "error: data.min_item_count=100000: no video is seen that often"),
])
def test_bad_overrides_are_one_line(isolated_outputs, capsys, argv, message):
    assert main(argv) == 2
    assert _one_error_line(capsys).startswith(message)


def test_bad_progress_settings_are_one_line(isolated_outputs, capsys, monkeypatch):
    monkeypatch.setenv("GRLIB_PROGRESS", "yes")
    assert main(TRAIN) == 2
    assert _one_error_line(capsys).startswith("error: GRLIB_PROGRESS='yes': expected 0 (silent), 1 (bars) or log")
    monkeypatch.setenv("GRLIB_PROGRESS", "log")
    monkeypatch.setenv("GRLIB_PROGRESS_INTERVAL", "soon")
    assert main(TRAIN) == 2
    assert _one_error_line(capsys).startswith("error: GRLIB_PROGRESS_INTERVAL='soon'")


def test_output_folder_grlib_did_not_make_is_refused(isolated_outputs, capsys):
    foreign = isolated_outputs / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["data", "prepare", "--dataset", "synthetic", "--n-users", "20", "--out", str(foreign)]) == 2
    assert str(foreign) in _one_error_line(capsys)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("flag,value,message", [
    ("--world", "0", "argument --world: must be >= 1, got 0"),
    ("--nodes", "0", "argument --nodes: must be >= 1, got 0"),
    ("--checkpoint-every", "-1", "argument --checkpoint-every: must be >= 0, got -1"),
    ("--staleness", "-2", "argument --staleness: must be >= 0, got -2"),
    ("--world", "two", "argument --world: expected an integer, got 'two'"),
])
def test_train_flags_out_of_range_are_one_line(isolated_outputs, capsys, flag, value, message):
    """Integer flags of `train` that are not config fields: refused by argparse (exit 2, one error line)
    instead of running one process (--world 0) or checkpointing every step (--checkpoint-every -1)."""
    with pytest.raises(SystemExit) as stop:
        main(["train", "--scale", "smoke", flag, value])
    assert stop.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert errors == [f"python -m grlib train: error: {message}"]
