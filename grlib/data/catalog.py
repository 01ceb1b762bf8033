"""The dataset catalogue: a dataset name -> its prepared folder -> the sequences and their
evaluation protocol.

    ds = load_dataset(cfg, "ml-100k")   # Dataset: name, data (SequenceData), folder, mask_history, ...
    folder = ensure_prepared(cfg)       # the scale's own data, prepared when absent or out of date
    stats = prepared_stats(Path("D"))   # a folder `data prepare --out D` made (anything else: DataError)
    ds = load_prepared(cfg, Path("D"))  # its sequences (`train --data D`)

A dataset name is "scale" (cfg.data.dataset) or any dataset of DataConfig; the other data settings
(max_len, target, ...) are cfg.data's. Folders, under data/processed/ (or GRLIB_DATA_DIR):

    data/processed/
      laptop/                   the scale's own data: params.yaml's scales.laptop.data, no override
                                (the output of the DVC `data` stage)
      synthetic-1b2c3d4e5f60/   any other data config, <dataset>-<key>: an override
      ml-100k-0a9b8c7d6e5f/     (`-o data.max_len=64`) or another dataset at a scale's settings

key = data_key(data config): sha256 (12 hex digits) of the fields that change the prepared output,
KEY_FIELDS for every dataset and GENERATOR_FIELDS for the synthetic one. A prepared folder records
its key in stats.json (`data_key`) and is reused while that key matches; otherwise (a folder of an
older grlib, or the scale's folder after params.yaml changed) it is prepared again. So a config
with overrides never reads data prepared with other settings, and preparing it leaves every
other folder as it was.

Preparing (prepare_to) writes sequences.parquet, vocab.parquet and stats.json through
grlib.data.preprocess.prepare_logs (grlib.io.output_dir: complete or absent, and only ever
replacing a folder grlib made). Raw logs: the synthetic twin is written as a KuaiRand-style CSV
first (into a temporary folder under data/raw/, grlib.io.temp_dir: the leftovers of a killed run
go at the next run); KuaiRand versions come from the download cache (grlib.data.download);
MovieLens-100K from the shared real-data slices when present, else from the cache
(grlib.data.movielens reads it into the log schema).

A rank of a data-parallel run loads with share=True: the folder's token arrays written once as flat
files under data/cache/arrays/ and read per batch (grlib.data.share), so a rank holds the per-user
arrays and its batches, not the dataset.

Evaluation protocol: history items are masked at evaluation only where no validation or test
target repeats a history item (repeat_fraction 0: MovieLens); on logs with repeat consumption
masking would hide the target (grlib.evaluate).
"""
from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grlib import io, paths
from grlib.config import Config, DataConfig, load_config, scale_names
from grlib.data import download, preprocess, registry
from grlib.data.movielens import read_ml100k
from grlib.schema import DataError
from grlib.data.synthetic import expected_rows, write_log_csv

if TYPE_CHECKING:
    from grlib.data.sequences import SequenceData

# the sequences, a rank's share and the evaluation protocol (torch, about 220 MB resident) are imported
# where a prepared folder is loaded: `data prepare` runs without them

KEY_FIELDS = ("dataset", "max_len", "min_item_count", "target", "context", "bucket_rows")
GENERATOR_FIELDS = ("n_users", "length_factor", "n_items", "seed")  # the synthetic twin's generator


@dataclass
class Dataset:
    name: str
    data: SequenceData
    folder: Path  # the prepared folder it was loaded from
    mask_history: bool  # MovieLens protocol; refused on logs with repeat consumption (grlib.evaluate)
    repeat_fraction: float  # share of validation / test targets that repeat a history item


def key_fields(data: DataConfig) -> dict:
    """The settings that change the prepared output of `data` (bucket_rows: the order of users)."""
    names = KEY_FIELDS + (GENERATOR_FIELDS if data.dataset == "synthetic" else ())
    return {k: getattr(data, k) for k in names}


def data_key(data: DataConfig) -> str:
    return hashlib.sha256(json.dumps(key_fields(data), sort_keys=True).encode()).hexdigest()[:12]


def dataset_config(cfg: Config, name: str = "scale") -> DataConfig:
    """cfg.data for dataset `name` ("scale": cfg.data.dataset)."""
    return cfg.data if name in ("scale", cfg.data.dataset) else dataclasses.replace(cfg.data, dataset=name)


def processed_root() -> Path:
    return paths.data_dir() / "processed"


def folder(cfg: Config, name: str = "scale") -> Path:
    """data/processed/<scale> for params.yaml's data of cfg.scale, else data/processed/<dataset>-<key>."""
    data = dataset_config(cfg, name)
    key = data_key(data)
    own = cfg.scale in scale_names() and key == data_key(load_config(cfg.scale).data)
    return processed_root() / (cfg.scale if own else f"{data.dataset}-{key}")


def prepared_key(out: Path) -> str | None:
    """The data_key recorded in out/stats.json, or None (no prepared data there)."""
    stats = out / "stats.json"
    if not ((out / "sequences.parquet").is_file() and stats.is_file()):
        return None
    try:
        return json.loads(stats.read_text()).get("data_key")
    except (json.JSONDecodeError, AttributeError):
        return None


def prepare(cfg: Config, name: str = "scale") -> dict:
    """Prepares dataset `name` of cfg into its folder (replacing what grlib prepared there); its stats."""
    return prepare_to(dataset_config(cfg, name), folder(cfg, name))


def ensure_prepared(cfg: Config, name: str = "scale") -> Path:
    """The folder of dataset `name`, prepared first unless it already holds this data config's output."""
    data, out = dataset_config(cfg, name), folder(cfg, name)
    if prepared_key(out) != data_key(data):
        prepare_to(data, out)
    return out


def load_dataset(cfg: Config, name: str = "scale", share: bool = False) -> Dataset:
    """The sequences of dataset `name` with its evaluation protocol, prepared first if needed. A
    real dataset that is neither on disk nor downloadable here raises FileNotFoundError or
    DownloadError. share=True (a rank of a data-parallel run): the token arrays stay in flat files
    read per batch and training batches are global batches known by their lengths, each rank
    reading the sequences its Planner assigns it (grlib.data.share)."""
    out = ensure_prepared(cfg, name)
    from grlib.data.sequences import SequenceData
    from grlib.data.share import MappedSequences, ensure_arrays
    from grlib.evaluate import split_repeat_fraction

    data = MappedSequences(ensure_arrays(out), global_batches=True) if share else SequenceData.load(out)
    rep = split_repeat_fraction(data, cfg.data.max_len)
    return Dataset(dataset_config(cfg, name).dataset, data, out, mask_history=rep == 0.0, repeat_fraction=rep)


# the data settings a prepared folder's stats.json records (prepare_logs), which a run on it takes
PREPARED_DATA_FIELDS = ("dataset", "max_len", "min_item_count", "target", "context")


def prepared_stats(out: Path) -> dict:
    """The stats.json of a folder that `data prepare` (prepare_to) made, with its dataset and data
    settings; any other folder raises DataError, one line naming it and what it lacks."""
    out = Path(out)
    how = "prepare one with `python -m grlib data prepare --dataset NAME --out DIR`"
    if not out.is_dir():
        raise DataError(f"{out}: folder not found; {how}")
    missing = [f for f in (io.MARKER, "sequences.parquet", "vocab.parquet", "stats.json") if not (out / f).is_file()]
    if missing or not io.is_grlib_output(out):
        raise DataError(f"{out}: not a folder `data prepare` made (no {', '.join(missing or [io.MARKER])}); {how}")
    try:
        stats = json.loads((out / "stats.json").read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"{out / 'stats.json'}: not valid JSON ({err.msg} at line {err.lineno}); {how}") from None
    lacks = [k for k in (*PREPARED_DATA_FIELDS, "data_key") if not isinstance(stats, dict) or k not in stats]
    if lacks:
        raise DataError(f"{out / 'stats.json'}: not written by `data prepare` (no {', '.join(lacks)}); {how}")
    return stats


def load_prepared(cfg: Config, out: Path) -> Dataset:
    """The sequences of a folder `data prepare` made (prepared_stats checks it), with their evaluation
    protocol; cfg.data should carry the folder's settings (PREPARED_DATA_FIELDS of its stats)."""
    stats = prepared_stats(out)
    from grlib.data.sequences import SequenceData
    from grlib.evaluate import split_repeat_fraction

    data = SequenceData.load(Path(out))
    rep = split_repeat_fraction(data, cfg.data.max_len)
    return Dataset(stats["dataset"], data, Path(out), mask_history=rep == 0.0, repeat_fraction=rep)


def raw_sources(cfg: DataConfig, work: Path, raw_dir: Path | None = None,
                mirror: str | None = None) -> list[preprocess.Source]:
    """The raw logs of cfg.dataset. Synthetic: written into `work` first. A real dataset: its log
    files (registry log_files) found anywhere under `raw_dir` when given, else the download cache,
    fetching from the registry URL or `mirror` (download.mirror_url) what is missing."""
    if cfg.dataset == "synthetic":
        if raw_dir is not None:
            raise DataError(f"{raw_dir}: the synthetic dataset is generated, it reads no raw folder")
        path = work / "synthetic.csv"
        write_log_csv(path, cfg.n_users, cfg.length_factor, cfg.n_items, cfg.seed)
        return [path]
    spec = registry.get(cfg.dataset)
    if raw_dir is not None:
        files = download.find_files(Path(raw_dir), spec.log_files, f"the raw folder of {spec.name}")
    elif spec.log_format == "ml-100k":
        files = [paths.real_data_file("movielens_100k/u.data") or download.log_paths(spec, mirror=mirror)[0]]
    else:
        files = download.log_paths(spec, mirror=mirror)
    return [read_ml100k(files[0])] if spec.log_format == "ml-100k" else files


def prepare_to(cfg: DataConfig, out: Path, raw_dir: Path | None = None, mirror: str | None = None) -> dict:
    """Writes sequences.parquet, vocab.parquet and stats.json (with data_key) of cfg into `out`,
    built aside and renamed when complete. An existing `out` is replaced only if grlib made it, else
    OutputRefused, checked before anything is generated or downloaded. raw_dir, mirror: see raw_sources.

    Temporary paths: data/raw/.<dataset>.grlib-<pid>-<host>-XXXXXXXX.tmp (the synthetic CSV) and the
    sibling of `out` (grlib.io.output_dir); the leftovers of killed runs there are removed first
    (grlib.io.sweep). A disk that fills up (ENOSPC, EDQUOT, or polars saying so) is one DataError
    naming the file system, what preparing needs and what is free; nothing half-written stays."""
    preprocess.check_output(out)
    work = io.temp_dir(paths.data_dir() / "raw", cfg.dataset)
    sources: list[preprocess.Source] | None = None
    try:
        sources = raw_sources(cfg, work, raw_dir, mirror)
        extra = {"dataset": cfg.dataset}
        if cfg.dataset == "synthetic":
            extra.update(n_users_generated=cfg.n_users, length_factor=cfg.length_factor)
        extra["data_key"] = data_key(cfg)
        return preprocess.prepare_logs(sources, out, max_len=cfg.max_len, min_item_count=cfg.min_item_count,
                                       target=cfg.target, context=cfg.context, bucket_rows=cfg.bucket_rows,
                                       extra_stats=extra)
    except Exception as err:
        # a download's own disk-full message says what is kept to resume
        if isinstance(err, download.DownloadError) or not io.is_disk_full(err):
            raise
        failure, needed = err, space_needed(cfg, sources)  # sized while the sources are still there
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raise disk_full_error(Path(out), needed, failure) from failure


def _failed_path(err: BaseException) -> Path | None:
    """The file an OSError in err's chain names (where the disk filled up), if any."""
    seen: BaseException | None = err
    for _ in range(10):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.filename:
            return Path(seen.filename)
        seen = seen.__cause__ or seen.__context__
    return None


def space_needed(cfg: DataConfig, sources: list[preprocess.Source] | None) -> tuple[int, str]:
    """(bytes, how they were counted) that preparing cfg writes: the preprocessing parts of the
    sources' rows (preprocess.PART_BYTES_PER_ROW, as its free-disk check), plus the synthetic log's
    CSV when it is not written yet, or a real dataset's extracted archive when none was read yet."""
    if sources is not None:
        rows = preprocess.estimated_rows(sources)
        return rows * preprocess.PART_BYTES_PER_ROW, f"{rows:,} rows x {preprocess.PART_BYTES_PER_ROW} bytes of parts"
    if cfg.dataset == "synthetic":
        rows = expected_rows(cfg.n_users, cfg.length_factor, cfg.seed)
        per_row = preprocess.BYTES_PER_ROW + preprocess.PART_BYTES_PER_ROW
        return rows * per_row, f"{rows:,} rows x {per_row} bytes: the log's CSV and the parts"
    spec = registry.get(cfg.dataset)
    return spec.extracted_bytes, f"the extracted {spec.archive}"


def disk_full_error(out: Path, needed: tuple[int, str], err: BaseException) -> DataError:
    """One line for a disk that filled up while preparing `out`: the file system (the written file's,
    else the output folder's), what preparing needs (space_needed) and what is free now that the
    temporary files are gone."""
    failed = _failed_path(err)
    where = failed.parent if failed is not None else out.parent
    while not where.exists() and where != where.parent:  # a temporary folder, removed by now
        where = where.parent
    mount = io.file_system(where)
    free = shutil.disk_usage(mount).free
    reason = "no space left on device"
    if any(isinstance(e, OSError) and e.errno == errno.EDQUOT for e in (err, err.__cause__, err.__context__)):
        reason = "disk quota exceeded"
    return DataError(f"{out}: the disk is full ({reason}) on the file system of {where} (mounted at {mount}): "
                     f"preparing needs about {io.human_bytes(needed[0])} ({needed[1]}), {io.human_bytes(free)} "
                     f"free; nothing was written to {out} and the temporary files are removed: free some space "
                     f"(or choose --out / GRLIB_DATA_DIR on a larger disk) and run again")
