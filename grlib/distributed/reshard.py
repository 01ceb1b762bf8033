"""Training checkpoints moved between world sizes (a row-sharded item table re-cut for N ranks).

A data-parallel run writes one checkpoint per rank (grlib.train.loop: last.rank<r>-of-<N>.pt; one
process: last.pt). Everything but the item table is the same on every rank (dense weights, their
optimizer state, the schedule, the sampler and RNG states, the position in the data). With sharded
items (grlib.distributed.sharded_embedding) rank r holds rows [start_r, stop_r) of the table and of its
lazy-Adam state (moments and per-row step counts), and so does the best model kept for selection.

    reshard(src, dst, world=1)   # a sharded 2-rank run's checkpoints -> one process's last.pt
    reshard(src, dst, world=2)   # one process's (or N ranks') checkpoint -> 2 ranks' files

gathers the table rows in rank order and cuts them in the blocks of the new world (row_blocks);
the resumed run continues the interrupted one (tests/test_sharded_items.py). A replicated run's
checkpoints hold the whole table on every rank and move as they are.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import torch

from grlib.distributed.sharded_embedding import ITEMS_KEY, row_blocks
from grlib.train import checkpoint

_RANK_FILE = re.compile(r"last\.rank(\d+)-of-(\d+)\.pt$")


def checkpoint_files(folder: Path) -> list[Path]:
    """The checkpoint of each rank of the run in `folder`, in rank order (one file for one process)."""
    folder = Path(folder)
    ranked = sorted((int(m.group(1)), int(m.group(2)), p) for p in folder.glob("last.rank*-of-*.pt")
                    if (m := _RANK_FILE.search(p.name)))
    single = folder / "last.pt"
    if ranked and single.exists():
        raise checkpoint.CheckpointError(f"{folder}: holds both last.pt and per-rank checkpoints; keep one run per folder")
    if not ranked:
        if not single.exists():
            raise checkpoint.CheckpointError(f"{folder}: no training checkpoint (last.pt or last.rank<r>-of-<N>.pt)")
        return [single]
    worlds = {n for _, n, _ in ranked}
    if len(worlds) != 1 or [r for r, _, _ in ranked] != list(range(worlds.pop())):
        raise checkpoint.CheckpointError(f"{folder}: per-rank checkpoints of one run expected "
                                         f"(ranks 0..N-1 of one N), found {[p.name for _, _, p in ranked]}")
    return [p for _, _, p in ranked]


def _items_state(state: dict) -> dict[str, torch.Tensor]:
    """The lazy-Adam state of the item table: the optimizer whose state has per-row 'step' counts."""
    for opt in state["optimizers"]["opts"]:
        for s in opt["state"].values():
            if isinstance(s.get("step"), torch.Tensor) and s["step"].dim() == 1:
                return s
    return {}


def _gather(states: list[dict]) -> dict[str, torch.Tensor]:
    """Full item rows of the model, the best model and the lazy-Adam state: every rank's shard in rank
    order, or rank 0's table when every rank holds the same whole table (a replicated run)."""
    tables = [s["model"][ITEMS_KEY] for s in states]
    replicated = all(t.shape == tables[0].shape and torch.equal(t, tables[0]) for t in tables)
    pick = (lambda parts: parts[0]) if replicated else (lambda parts: torch.cat(parts))
    out = {"model": pick(tables)}
    if states[0]["best"].get("state") is not None:
        out["best"] = pick([s["best"]["state"][ITEMS_KEY] for s in states])
    for key in _items_state(states[0]):
        out[f"opt.{key}"] = pick([_items_state(s)[key] for s in states])
    return out


def reshard(src: str | Path, dst: str | Path, world: int, sharded: bool = True) -> list[Path]:
    """Writes the checkpoints of `world` ranks into `dst` from the run in `src`; returns their paths.
    sharded: the new run shards its item table (False: every rank gets the whole table)."""
    files = checkpoint_files(Path(src))
    states = [checkpoint.load(p) for p in files]
    full = _gather(states)
    V = full["model"].shape[0]
    blocks = row_blocks(V, world) if sharded and world > 1 else [(0, V)] * world
    written = []
    for rank, (start, stop) in enumerate(blocks):
        state = copy.deepcopy(states[0])
        state["model"][ITEMS_KEY] = full["model"][start:stop].clone()
        if "best" in full:
            state["best"]["state"][ITEMS_KEY] = full["best"][start:stop].clone()
        items = _items_state(state)
        for key in list(items):
            items[key] = full[f"opt.{key}"][start:stop].clone()
        ident = state.get("identity", {})
        ident.pop("world", None)
        if world > 1:
            ident["world"] = world
        state["model_signature"]["shapes"][ITEMS_KEY] = [stop - start, full["model"].shape[1]]
        path = Path(dst) / ("last.pt" if world == 1 else f"last.rank{rank}-of-{world}.pt")
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint.save(path, _drop(state, "format"))
        written.append(path)
    return written


def _drop(state: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != key}
