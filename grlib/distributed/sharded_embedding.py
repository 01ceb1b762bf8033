"""The item table sharded row-wise over ranks, behind the ItemTable seam (grlib.model.embeddings).

Rank r holds rows [start_r, stop_r) of the V x d table: contiguous blocks of ceil(V / P) rows in
rank order, the layout TorchRec's row-wise sharding gives. A lookup is an exchange (grlib.distributed.alltoall.Route):

    ids [N] --owner = block of each id--> owners   (ids' trip; de-duplicated per rank or node)
    owner: rows = shard[ids - start]               (the local lookup)
    rows --reply--> [N, d] aligned with the ids    (rows' trip)
    backward: row gradients --> owners, summed per row, accumulated into the shard's gradient

so the shard's gradient is complete on its owner (no all-reduce) and lazy Adam steps each shard
(grlib.train.optim). Every lookup is collective: all ranks look up (possibly zero ids) in the same
order, which the data-parallel step guarantees (one input lookup, one loss lookup per step).

Full ranking (`score`): each rank scores its own rows, and grlib.evaluate combines the ranks'
counts exactly (ShardScores): no row leaves its owner, no top-k cap.

    shard_item_table(model, runtime, mode="hierarchical", dedup="rank")   # in place, from the full table
    gather_table(state_dicts) / table_rows(...)                          # checkpoints across world sizes
"""
from __future__ import annotations

import collections
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from grlib.schema import PAD_ID
from grlib.distributed.alltoall import LinkCounters, Route
from grlib.evaluate import ShardScores

ITEMS_KEY = "embed.items.weight"  # the item table's entry in a model's state_dict
MODES = ("replicated", "flat", "hierarchical")


def row_blocks(n_rows: int, world: int) -> list[tuple[int, int]]:
    """[start, stop) of each rank: blocks of ceil(V / P) rows in rank order (the last ones may be short or empty)."""
    size = -(-n_rows // world) if world else 0
    return [(min(r * size, n_rows), min((r + 1) * size, n_rows)) for r in range(world)]


class ShardedRows(nn.Module):
    """This rank's rows of a V x d table; `forward(ids)` returns any rows [N, d] (a collective)."""

    def __init__(self, table: Tensor, runtime, mode: str = "flat", dedup: str = "rank",
                 counters: LinkCounters | None = None, padding_idx: int | None = PAD_ID):
        super().__init__()
        if mode not in ("flat", "hierarchical"):
            raise ValueError(f"mode must be 'flat' or 'hierarchical', got {mode!r}")
        topo = runtime.topology
        self.runtime, self.mode, self.dedup = runtime, mode, dedup
        self.counters = counters if counters is not None else LinkCounters()
        self.n_rows, self.dim = table.shape
        self.bounds = row_blocks(self.n_rows, topo.world)
        self.start, self.stop = self.bounds[topo.rank]
        self.weight = nn.Parameter(table[self.start:self.stop].detach().clone())  # [V_r, d]
        self._prepared: collections.deque = collections.deque()  # (ids, route) built ahead, in lookup order
        self._ahead: collections.deque = collections.deque()  # StreamLookups fetched ahead, in lookup order
        self.register_buffer("_starts", torch.tensor([b[0] for b in self.bounds]), persistent=False)  # [P]
        if padding_idx is not None and self.start <= padding_idx < self.stop:
            local = padding_idx - self.start
            self.weight.register_hook(lambda g: g.index_fill(0, torch.tensor([local]), 0.0))

    def owner(self, ids: Tensor) -> Tensor:  # [N] -> [N] rank of each id
        return torch.searchsorted(self._starts, ids, right=True) - 1

    def route(self, ids: Tensor, runtime=None) -> Route:
        """The exchange that looks `ids` [N] up (a collective over `runtime`'s groups, default this
        table's): built ahead on a side channel by a prefetching schedule, then `prepare`d."""
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.n_rows):
            raise IndexError(f"item ids out of range [0, {self.n_rows})")
        return Route.build(flat, self.owner(flat), runtime or self.runtime, self.mode, self.dedup, self.counters)

    def prepare(self, ids: Tensor, route: Route) -> None:
        """Queues a route built ahead for the next lookup of exactly `ids` (lookups take them in order)."""
        self._prepared.append((ids.reshape(-1), route))

    def expect(self, lookup) -> None:
        """Queues rows fetched ahead on a communication stream (grlib.distributed.stream.StreamLookup)
        for the next lookup of exactly lookup.ids: that lookup returns them instead of a trip."""
        self._ahead.append(lookup)

    def forward(self, ids: Tensor) -> Tensor:  # [N] int64 -> [N, d]
        flat = ids.reshape(-1)
        if self._ahead:
            lookup = self._ahead.popleft()
            if not torch.equal(lookup.ids, flat):
                raise RuntimeError("ShardedRows: the rows fetched ahead were fetched for other ids than this lookup's")
            return lookup.rows().reshape(*ids.shape, self.dim)
        if self._prepared:
            want, route = self._prepared.popleft()
            if not torch.equal(want, flat):
                raise RuntimeError("ShardedRows: the route prepared ahead was built for other ids than this lookup's")
        else:
            route = self.route(flat)
        rows = self.weight.index_select(0, route.ids - self.start)  # [M, d]
        return route.reply(rows).reshape(*ids.shape, self.dim)

    def score(self, user: Tensor) -> ShardScores:
        """user [B, d] . every normalised row of this shard, as a ShardScores of columns [start, stop)."""
        scores = user @ F.normalize(self.weight, dim=-1).T  # [B, V_r]
        return ShardScores(scores, self.start, self.n_rows, sum_over(self.runtime.world_group))

    def extra_repr(self) -> str:
        return f"rows {self.start}:{self.stop} of {self.n_rows}, d={self.dim}, {self.mode}, dedup {self.dedup}"


def sum_over(group):
    """x -> x summed over the ranks of `group` (a copy; an all-reduce)."""
    def reduce(x: Tensor) -> Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x
    return reduce


def shard_item_table(model: nn.Module, runtime, mode: str, dedup: str = "rank",
                     counters: LinkCounters | None = None) -> ShardedRows:
    """Replaces model.embed.items (an nn.Embedding holding the full table, equal on every rank) by
    this rank's ShardedRows of it; returns the new module."""
    items = model.embed.items
    if not isinstance(items, nn.Embedding):
        raise TypeError(f"model.embed.items is {type(items).__name__}, not an nn.Embedding to shard")
    sharded = ShardedRows(items.weight.detach(), runtime, mode, dedup, counters, items.padding_idx)
    model.embed.items = sharded
    return sharded


def table_rows(table: Tensor, world: int, rank: int) -> Tensor:
    """The rows rank `rank` of `world` holds (a checkpoint's table loaded into another world size)."""
    start, stop = row_blocks(table.shape[0], world)[rank]
    return table[start:stop]


def gather_table(shards: Sequence[Tensor]) -> Tensor:
    """The full table from every rank's shard, in rank order ([V_r, d] each -> [V, d])."""
    return torch.cat(list(shards))
