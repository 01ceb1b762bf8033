"""`data prepare` never deletes what grlib did not create: `--out .` and foreign folders are
refused and left as they were, whatever their files are called (a lone stats.json of the user's
is as safe as a thesis), a folder grlib made (its marker) is replaced whole, a failure leaves the previous output and no temporary folder, and the
files and folders made honour the umask."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import polars as pl
import pytest

from grlib import io
from grlib.cli import main
from grlib.config import load_config
from grlib.data import catalog, preprocess
from grlib.data.preprocess import PREPARED_FILES, prepare_logs
from grlib.data.synthetic import generate_log

SMALL = ["--n-users", "20", "--max-len", "8", "--bucket-rows", "2000"]


def _snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> md5 (files) or 'dir' of everything under folder, dot files included."""
    return {str(p.relative_to(folder)): ("dir" if p.is_dir() else hashlib.md5(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*"))}


def _log(seed: int = 0) -> pl.DataFrame:
    return generate_log(12, 0.002, 60, seed=seed)


def _prepare_cli(capsys, out: str) -> tuple[int, str]:
    code = main(["data", "prepare", "--dataset", "synthetic", "--out", out, *SMALL])
    return code, capsys.readouterr().err


def test_out_dot_leaves_every_file_of_the_working_folder(tmp_path, monkeypatch, capsys, isolated_outputs):
    work = tmp_path / "scratch"
    (work / "notes").mkdir(parents=True)
    (work / "unrelated.txt").write_text("keep me\n")
    (work / "notes" / "a.md").write_text("and me\n")
    before, around = _snapshot(work), sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.chdir(work)
    code, err = _prepare_cli(capsys, ".")
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: .: is the working folder")
    assert _snapshot(work) == before and sorted(p.name for p in tmp_path.iterdir()) == around
    # its parent too (a checkout would be one)
    code, err = _prepare_cli(capsys, "..")
    assert code == 2 and "working folder or one of its parents" in err
    assert _snapshot(work) == before


def test_a_foreign_non_empty_folder_is_refused_and_untouched(tmp_path, capsys, isolated_outputs):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("\\section{Results}\n")
    before = _snapshot(tmp_path)
    code, err = _prepare_cli(capsys, str(out))
    assert code == 2 and err.count("\n") == 1
    assert f"error: {out}: folder is not empty and was not made by grlib" in err
    assert _snapshot(tmp_path) == before  # nothing removed, nothing added beside it
    with pytest.raises(io.OutputRefused, match=f"{out}: folder is not empty"):
        prepare_logs([_log()], out, max_len=8)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("names", [["stats.json"], list(PREPARED_FILES), [*PREPARED_FILES, "my_analysis.ipynb"],
                                   ["notes.txt"], [".hidden"]])
def test_a_folder_without_the_marker_is_refused_whatever_its_file_names(tmp_path, capsys, isolated_outputs, names):
    """The names grlib itself writes earn no exception: only the marker, or an empty folder, does."""
    out = tmp_path / "seqs"
    out.mkdir()
    for name in names:
        (out / name).write_text("the user's own\n")
    before = _snapshot(tmp_path)
    code, err = _prepare_cli(capsys, str(out))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {out}: folder is not empty and was not made by grlib (no {io.MARKER} file; "
                          f"it holds {sorted(names)[0]}")
    with pytest.raises(io.OutputRefused, match="seqs: folder is not empty"):
        prepare_logs([_log()], out, max_len=8)
    assert _snapshot(tmp_path) == before


def test_an_empty_folder_is_written(tmp_path):
    out = tmp_path / "seqs"
    out.mkdir()
    prepare_logs([_log()], out, max_len=8)
    assert sorted(p.name for p in out.iterdir()) == sorted([io.MARKER, *PREPARED_FILES])


def test_a_folder_grlib_made_is_replaced_whole(tmp_path, capsys, isolated_outputs):
    out = tmp_path / "seqs"
    assert _prepare_cli(capsys, str(out))[0] == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([io.MARKER, *PREPARED_FILES])
    first = _snapshot(out)
    assert main(["data", "prepare", "--dataset", "synthetic", "--out", str(out), *SMALL, "--seed", "5"]) == 0
    second = _snapshot(out)
    assert second.keys() == first.keys() and second["sequences.parquet"] != first["sequences.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "seqs"]  # no temporary or old folder left


def test_a_failure_mid_prepare_keeps_the_old_output_and_leaves_no_temporary_folder(tmp_path, monkeypatch):
    out = tmp_path / "seqs"
    prepare_logs([_log()], out, max_len=8, bucket_rows=100)
    before = _snapshot(tmp_path)
    calls = []
    real = preprocess.group_sequences

    def fails_on_the_second_bucket(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # 1: the empty schema, 2: the first bucket (written), 3: the second
            raise RuntimeError("killed mid-prepare")
        return real(*args, **kwargs)

    monkeypatch.setattr(preprocess, "group_sequences", fails_on_the_second_bucket)
    with pytest.raises(RuntimeError, match="killed mid-prepare"):
        prepare_logs([_log(seed=1)], out, max_len=8, bucket_rows=100)
    assert len(calls) == 3
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_prepared_files_and_folders_honour_the_umask(tmp_path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        prepare_logs([_log()], tmp_path / "seqs", max_len=8)
    finally:
        os.umask(old)
    out = tmp_path / "seqs"
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {name: file_mode for name in [io.MARKER, *PREPARED_FILES]}


def test_the_catalogue_folder_goes_through_the_same_check(isolated_outputs):
    cfg = load_config("smoke", {"data.n_users": 20, "data.max_len": 8})
    processed = catalog.folder(cfg)
    stats = catalog.prepare(cfg)
    assert (processed / io.MARKER).is_file() and stats["dataset"] == "synthetic"
    assert pl.read_parquet(processed / "sequences.parquet").height == stats["users"]
    catalog.prepare(cfg)  # its own output (the marker): replaced

    (processed / io.MARKER).unlink()  # no marker, nothing but the names grlib writes: refused all the same
    before = _snapshot(isolated_outputs)
    with pytest.raises(io.OutputRefused, match=rf"processed/{processed.name}: folder is not empty"):
        catalog.prepare(cfg)
    assert _snapshot(isolated_outputs) == before


def test_the_same_inputs_give_a_byte_identical_folder(tmp_path):
    """The marker carries no timestamp: DVC sees the same output hash when nothing changed."""
    prepare_logs([_log()], tmp_path / "a", max_len=8, bucket_rows=100)
    prepare_logs([_log()], tmp_path / "b", max_len=8, bucket_rows=100)
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")
    assert len(_snapshot(tmp_path / "a")) == 4
