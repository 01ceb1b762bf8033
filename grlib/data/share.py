"""Each rank reads its share: a prepared dataset's token arrays as flat files, read per batch.

A rank of a data-parallel run (grlib.distributed.data_parallel) trains only the sequences the
Planner assigns it out of each global batch. MappedSequences keeps in memory only the per-user
arrays (user_offsets [U+1], val_pos [U], test_pos [U]: 24 bytes a user) and reads the token
arrays of a batch's windows from flat files with positioned reads (os.preadv) into fresh arrays,
so what a rank holds for data is those arrays plus the batches in flight, whatever the dataset's
size; the file pages live in the OS page cache (shared by the ranks of a node, reclaimable), not
in any rank's resident set. Training batches are GlobalBatch: the global batch's lengths only,
enough for the Planner's assignment and the per-step fingerprint (sequences, tokens, a length
checksum); `select(rows)` reads the rank's own sequences; `targets` (the negative path draws the
global batch's negatives, so every rank draws the same ids) reads the global windows' items and
target flags once per step (9 of the 25 bytes per token) and is dropped with the batch.

    arrays = ensure_arrays(folder)      # data/cache/arrays/<folder name>-<signature>/, built once
    data = MappedSequences(arrays, global_batches=True)
    for batch in data.train_batches(B, max_len, rng): plan = planner(batch)   # GlobalBatch

Flat files (little-endian, back to back over users in the table's order): items.bin int32,
actions.bin int16, timestamps.bin int64, is_target.bin uint8 (0/1) [N events]; users.npz with
user_offsets, val_pos, test_pos; manifest.json (n_users, n_events, n_items, the dtypes, the
source's signature). Built from sequences.parquet in chunks of users (memory: one chunk), in a
temporary sibling folder renamed when complete (grlib.io.output_dir). The signature is a hash of
the prepared folder's stats.json and the parquet file's size and modification time, so a folder
prepared again gets new arrays.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import torch

from grlib import paths
from grlib.io import output_dir
from grlib.jagged import JaggedBatch
from grlib.schema import FIRST_ITEM_ID, DataError
from grlib.data.sequences import SequenceData

DISK_DTYPES = {"items": np.int32, "actions": np.int16, "timestamps": np.int64, "is_target": np.uint8}
COLUMNS = {"items": "item_ids", "actions": "actions", "timestamps": "timestamps", "is_target": "is_target"}
CHUNK_USERS = 4096


def signature(folder: Path) -> str:
    """12 hex digits naming one preparation of `folder` (stats.json, sequences.parquet size and mtime)."""
    seqs = Path(folder) / "sequences.parquet"
    st = seqs.stat()
    stats = (Path(folder) / "stats.json").read_bytes() if (Path(folder) / "stats.json").is_file() else b""
    return hashlib.sha256(stats + f"|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]


def arrays_folder(folder: Path) -> Path:
    return paths.data_dir() / "cache" / "arrays" / f"{Path(folder).name}-{signature(folder)}"


def ensure_arrays(folder: Path) -> Path:
    """The flat arrays of the prepared `folder`, written first when absent."""
    out = arrays_folder(folder)
    if not (out / "manifest.json").is_file():
        write_arrays(folder, out)
    return out


def write_arrays(folder: Path, out: Path, chunk_users: int = CHUNK_USERS) -> dict:
    """sequences.parquet of `folder` -> flat files in `out`, chunk_users users at a time."""
    source = Path(folder) / "sequences.parquet"
    scan = pl.scan_parquet(source).select(*COLUMNS.values(), "val_pos", "test_pos")
    n_users = int(pl.scan_parquet(source).select(pl.len()).collect().item())
    n_items = pl.scan_parquet(Path(folder) / "vocab.parquet").select(pl.len()).collect().item() + FIRST_ITEM_ID
    lengths, val_pos, test_pos = [], [], []
    with output_dir(out, what="flat sequence arrays") as tmp:
        files = {name: open(tmp / f"{name}.bin", "wb") for name in DISK_DTYPES}
        try:
            for start in range(0, n_users, chunk_users):
                part = scan.slice(start, chunk_users).collect()
                lengths.append(part["item_ids"].list.len().to_numpy().astype(np.int64))
                val_pos.append(part["val_pos"].to_numpy().astype(np.int64))
                test_pos.append(part["test_pos"].to_numpy().astype(np.int64))
                for name, column in COLUMNS.items():
                    part[column].explode().to_numpy().astype(DISK_DTYPES[name]).tofile(files[name])
        finally:
            for fh in files.values():
                fh.close()
        cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # noqa: E731
        offsets = np.concatenate([[0], np.cumsum(cat(lengths))]).astype(np.int64)
        np.savez(tmp / "users.npz", user_offsets=offsets, val_pos=cat(val_pos), test_pos=cat(test_pos))
        manifest = {"n_users": n_users, "n_events": int(offsets[-1]), "n_items": int(n_items),
                    "dtypes": {k: np.dtype(v).name for k, v in DISK_DTYPES.items()}, "signature": out.name}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


class MappedSequences(SequenceData):
    """SequenceData whose token arrays stay on disk (module docstring); the per-user arrays in memory.
    global_batches=True: train_batches yields GlobalBatch (a rank of N) instead of JaggedBatch."""

    def __init__(self, arrays: Path, global_batches: bool = False):  # noqa: super().__init__ reads a table
        arrays = Path(arrays)
        manifest = json.loads((arrays / "manifest.json").read_text())
        self.arrays, self.global_batches = arrays, global_batches
        self.n_users, self.n_items, self.n_events = manifest["n_users"], manifest["n_items"], manifest["n_events"]
        with np.load(arrays / "users.npz") as users:
            self.user_offsets, self.val_pos, self.test_pos = (users[k] for k in ("user_offsets", "val_pos", "test_pos"))
        if self.user_offsets.size != self.n_users + 1 or int(self.user_offsets[-1]) != self.n_events:
            raise DataError(f"{arrays / 'users.npz'}: {self.user_offsets.size - 1} users, {int(self.user_offsets[-1])} "
                            f"events; manifest.json says {self.n_users}, {self.n_events}")
        self._fds: dict[str, int] = {}
        for name, dtype in DISK_DTYPES.items():
            path = arrays / f"{name}.bin"
            size = path.stat().st_size
            if size != self.n_events * np.dtype(dtype).itemsize:
                raise DataError(f"{path}: {size} bytes, expected {self.n_events} events of {np.dtype(dtype).name}")
            self._fds[name] = os.open(path, os.O_RDONLY)

    @property
    def items(self):  # the whole-read attributes are absent by design: every read goes through _tokens
        raise AttributeError("MappedSequences keeps no token array in memory; read ranges with _tokens")

    actions = timestamps = is_target = items

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __del__(self):
        if getattr(self, "_fds", None):
            self.close()

    def _tokens(self, name: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        dtype = DISK_DTYPES[name]
        size = np.dtype(dtype).itemsize
        starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        lengths = ends - starts
        out = np.empty(int(lengths.sum()), dtype=dtype)
        view, fd, at = memoryview(out).cast("B"), self._fds[name], 0
        for s, n in zip(starts.tolist(), lengths.tolist()):
            if n > 0:
                got = os.preadv(fd, [view[at * size:(at + n) * size]], s * size)
                if got != n * size:
                    raise DataError(f"{self.arrays / (name + '.bin')}: short read at event {s} ({got} of {n * size} bytes)")
                at += n
        return out.astype(bool) if name == "is_target" else out.astype(np.int64)

    def train_batches(self, batch_size: int, max_len: int, rng: np.random.Generator):
        if not self.global_batches:
            yield from super().train_batches(batch_size, max_len, rng)
            return
        for users in self.train_order(batch_size, rng):
            yield GlobalBatch(self, users, self.val_pos[users], max_len)


class GlobalBatch:
    """A global training batch known by its lengths; its tokens are read only for the rows a rank
    selects (and its targets, for the negatives, when asked). The part of JaggedBatch's interface
    the Planner uses: offsets, lengths(), batch_size, num_tokens, targets, select(rows), attachments."""

    def __init__(self, data: SequenceData, users: np.ndarray, ends: np.ndarray, max_len: int):
        self.data, self.users, self.ends, self.max_len = data, users, ends, max_len
        self._a, self._b, offsets = data._windows(users, ends, max_len)
        self.offsets = torch.from_numpy(offsets)  # [B+1]
        self.attachments: dict = {}
        self._targets = None

    @property
    def batch_size(self) -> int:
        return self.users.size

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def lengths(self) -> torch.Tensor:  # [B]
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def targets(self) -> torch.Tensor:
        """[T] the global batch's targets, read on first use (the negative path's draw)."""
        if self._targets is None:
            offsets = self.offsets.numpy()
            items = self.data._tokens("items", self._a, self._b)
            self._targets = torch.from_numpy(self.data._targets(self._a, self._b, offsets, items))
        return self._targets

    def select(self, rows) -> JaggedBatch:
        """The sub-batch of sequences `rows` (in that order), read from the data now."""
        rows = np.asarray(rows.cpu().numpy() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64).reshape(-1)
        return self.data._batch(self.users[rows], self.ends[rows], self.max_len, with_targets=True)

    def materialize(self) -> JaggedBatch:
        """The whole global batch as a JaggedBatch (tests, one process)."""
        return self.select(np.arange(self.batch_size))
