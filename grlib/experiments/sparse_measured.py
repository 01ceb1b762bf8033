"""The measured parts of stage `sparse` (grlib.experiments.sparse_stage): what its launched ranks run, and
the rows made of what they return.

    out = launch(rank_program, 4, nodes=2, args=({"gloo": ([65536, 1048576], 15), "memory": (V, d, 0)},))
    rows = gloo_rows({4: out[0]["gloo"]})

rank_program runs the tasks it is given, each optional, in a fixed order (every lookup is collective:
all ranks run the same tasks): gloo (sizes, repeats) times all_to_all_single (grlib.sim.alltoall.
measure_gloo) with the 1-minute load before and after; memory (V, d, seed) builds this rank's
ShardedRows shard and reports its bytes; counters {ids, n_items, d, seed, repeats} looks this rank's
ids up in each of VARIANTS (LinkCounters of the first lookup, rows vs table[ids], median seconds of the
repeats); torchrec (the same keys) looks them up through TorchRec's row-wise table and grlib's flat
one. The table is drawn from `seed` on every rank (the same V x d float32 values), so only ids travel
to the ranks. The *_rows functions turn the ranks' results into rows of table `sparse`; inter_ids
computes from the ids alone the inter-node traffic the counters must show.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from grlib.data.sequences import SequenceData
from grlib.distributed import torchrec_peer
from grlib.distributed.alltoall import LinkCounters
from grlib.distributed.sharded_embedding import ShardedRows, row_blocks
from grlib.distributed.topology import Runtime
from grlib.sim.alltoall import Cluster, fit_link, flat_time, measure_gloo

FP32 = 4  # bytes per table element
LOOKUP_WORLD, LOOKUP_NODES = 4, 2  # the counters' ranks: 2 nodes x 2
GLOO_SOURCE = "fit_link on measure_gloo here: gloo over loopback TCP, one link for every pair"

VARIANTS = (("flat", "none"), ("flat", "rank"), ("hierarchical", "rank"), ("hierarchical", "node"))


def item_table(n_items: int, d: int, seed: int) -> torch.Tensor:
    """The same [n_items, d] float32 table on every rank."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n_items, d), dtype=np.float32))


def rank_program(runtime: Runtime, tasks: dict) -> dict:
    """This rank's results of each task in `tasks` (module docstring), in a fixed order."""
    out: dict = {}
    if "gloo" in tasks:
        sizes, repeats = tasks["gloo"]
        before = os.getloadavg()[0]
        rows = measure_gloo(runtime, sizes, repeats)
        out["gloo"] = {"rows": rows, "load_before": before, "load_after": os.getloadavg()[0]}
    if "memory" in tasks:
        V, d, seed = tasks["memory"]
        shard = ShardedRows(item_table(V, d, seed), runtime, padding_idx=None)
        out["memory"] = {"rank": runtime.topology.rank, "shard_rows": shard.stop - shard.start,
                         "shard_bytes": shard.weight.numel() * shard.weight.element_size()}
    if "counters" in tasks:
        out["counters"] = counters(runtime, **tasks["counters"])
    if "torchrec" in tasks:
        out["torchrec"] = torchrec(runtime, **tasks["torchrec"])
    return out


def counters(runtime: Runtime, ids: list[np.ndarray], n_items: int, d: int, seed: int, repeats: int) -> list[dict]:
    """This rank's ids through every VARIANT: what it sent per link class in the first lookup (ids out,
    rows back), whether the rows equal table[ids], median seconds of `repeats` more."""
    table = item_table(n_items, d, seed)
    mine = torch.from_numpy(ids[runtime.topology.rank])  # [N] int64
    out = []
    for mode, dedup in VARIANTS:
        c = LinkCounters()
        shard = ShardedRows(table, runtime, mode, dedup, c, padding_idx=None)
        with torch.no_grad():
            rows = shard(mine)  # [N, d]
            counted = c.as_dict()
            seconds = runtime.timed(lambda: shard(mine), repeats)
        out.append({"mode": mode, "dedup_by": dedup, "ids": mine.numel(), "distinct_ids": int(mine.unique().numel()),
                    **counted, "rows_equal": bool(torch.equal(rows, table[mine])), "lookup_s": seconds})
    return out


def torchrec(runtime: Runtime, ids: list[np.ndarray], n_items: int, d: int, seed: int, repeats: int) -> dict:
    """This rank's ids through TorchRec's row-wise table and grlib's flat one (no de-duplication, as
    TorchRec's lookup): rows, shard rows, median seconds; {"skipped": why} without torchrec."""
    with warnings.catch_warnings():  # TorchRec 1.8 warns of its own deprecations on import
        warnings.simplefilter("ignore", DeprecationWarning)
        ok, why = torchrec_peer.available()
        if not ok:
            return {"skipped": why}
        table = item_table(n_items, d, seed)
        mine = torch.from_numpy(ids[runtime.topology.rank])  # [N] int64
        peer = torchrec_peer.rowwise_lookup(runtime, table, mine, repeats=repeats)
    shard = ShardedRows(table, runtime, "flat", "none", padding_idx=None)
    with torch.no_grad():
        rows = shard(mine)  # [N, d]
        seconds = runtime.timed(lambda: shard(mine), repeats)
    return {"ids": mine.numel(), "rows_equal": bool(torch.equal(peer["rows"], rows)),
            "rows_equal_table": bool(torch.equal(rows, table[mine])),
            "same_shard": tuple(peer["shard_rows"]) == (shard.start, shard.stop),
            "torchrec_s": peer["seconds"], "grlib_s": seconds}


def lookup_ids(data: SequenceData, max_len: int, world: int, users: int, seed: int = 0) -> list[np.ndarray]:
    """Each rank's share (`users` users, fewer where the data has fewer) of one training batch's item ids."""
    U = min(users, data.n_users // world)
    if U < 1:
        raise ValueError(f"the data has {data.n_users} users: too few for {world} ranks")
    batch = next(data.train_batches(world * U, max_len, np.random.default_rng(seed)))
    ids, off = batch.item_ids.numpy(), batch.offsets.numpy()  # [T], [world * U + 1]
    return [ids[off[r * U]:off[(r + 1) * U]].astype(np.int64) for r in range(world)]


def inter_ids(ids: list[np.ndarray], n_items: int, local_world: int) -> dict[str, int]:
    """Ids that cross nodes in one lookup (each way), per de-duplication, computed from the ids alone:
    none, every id; rank, each rank's distinct ids; node, each node's distinct ids."""
    block = row_blocks(n_items, len(ids))[0][1]  # rows per rank (ceil(V / P))
    node_of = lambda x: x // block // local_world  # noqa: E731  owner's node of each id
    nodes = len(ids) // local_world
    per_node = [np.unique(np.concatenate(ids[n * local_world:(n + 1) * local_world])) for n in range(nodes)]
    return {"none": int(sum((node_of(x) != r // local_world).sum() for r, x in enumerate(ids))),
            "rank": int(sum((node_of(np.unique(x)) != r // local_world).sum() for r, x in enumerate(ids))),
            "node": int(sum((node_of(u) != n).sum() for n, u in enumerate(per_node)))}


def counters_rows(out: list[dict], ids: list[np.ndarray], n_items: int, d: int) -> list[dict]:
    """Rows of the counters part: each rank's counts per variant, and the inter-node bytes of the
    variant summed over ranks, counted and as the ids imply (each crossing id: 8 bytes out, its row back)."""
    crossing = inter_ids(ids, n_items, LOOKUP_WORLD // LOOKUP_NODES)
    total = {(v["mode"], v["dedup_by"]): sum(per[i]["inter_bytes"] for per in out) for i, v in enumerate(out[0])}
    return [{"part": "counters", "obtained": "measured", "ranks": LOOKUP_WORLD, "nodes": LOOKUP_NODES, "rank": rank,
             "n_items": n_items, "d_model": d, **v, "inter_bytes_total": total[(v["mode"], v["dedup_by"])],
             "inter_bytes_expected_total": crossing[v["dedup_by"]] * (8 + d * FP32)}
            for rank, per in enumerate(out) for v in per]


def memory_rows(measured: dict[int, list[dict]], n_items: int, d: int, paper_items: int, d_paper: int,
                ranks: list[int]) -> list[dict]:
    """Measured shard bytes per world size (max and sum over ranks); computed for the paper's table
    (paper_items x d_paper, fp32 weights and with 2 Adam moments) at 1 and each of `ranks` ranks."""
    rows = [{"part": "memory", "obtained": "measured", "ranks": P, "n_items": n_items, "d_model": d,
             "shard_bytes": max(r["shard_bytes"] for r in per), "shard_bytes_total": sum(r["shard_bytes"] for r in per),
             "even_bytes": n_items * d * FP32 / P, "block_bytes": row_blocks(n_items, P)[0][1] * d * FP32}
            for P, per in sorted(measured.items())]
    V = paper_items
    for P in sorted({1, *ranks}):
        block = row_blocks(V, P)[0][1] * d_paper * FP32
        rows.append({"part": "memory", "obtained": "computed", "ranks": P, "n_items": V, "d_model": d_paper,
                     "shard_bytes": block, "even_bytes": V * d_paper * FP32 / P, "block_bytes": block,
                     "with_adam_bytes": 3 * block})
    return rows


def gloo_rows(measured: dict[int, dict]) -> list[dict]:
    """Rows of the gloo part: per world size and size, the median, alpha + beta * m fitted per message
    (seconds / (P - 1)) to that world's times and its prediction (the 2-rank fit's beside the others)."""
    fits, cpus = {}, os.cpu_count() or 1
    for P, g in measured.items():
        m = np.array([r["bytes_per_peer"] for r in g["rows"]], dtype=np.float64)
        fits[P] = fit_link(m, np.array([r["seconds"] for r in g["rows"]]) / (P - 1))
    rows = []
    for P, g in sorted(measured.items()):
        for r in g["rows"]:
            L, m = r["local_world"], float(r["bytes_per_peer"])
            predict = lambda link: flat_time(Cluster("gloo-here", L, link, link, GLOO_SOURCE), P, m)  # noqa: E731
            row = {"part": "gloo", "obtained": "measured", **r, "predicted_s": predict(fits[P]),
                   "alpha_s": fits[P].alpha_s, "beta_s_per_byte": fits[P].beta_s_per_byte, "source": GLOO_SOURCE,
                   "load_before": g["load_before"], "load_after": g["load_after"], "cpus": cpus}
            row["error"] = row["predicted_s"] / r["seconds"] - 1
            if P != 2 and 2 in fits:
                row["predicted_from_2_s"] = predict(fits[2])
                row["error_from_2"] = row["predicted_from_2_s"] / r["seconds"] - 1
            rows.append(row)
    return rows


def torchrec_rows(out: list[dict] | None, why: str, n_items: int, d: int) -> list[dict]:
    """One row: TorchRec vs grlib on the same ids (over ranks: all equal, slowest median), or `skipped`."""
    if out is None or "skipped" in out[0]:
        return [{"part": "torchrec", "obtained": "skipped", "skipped": why if out is None else out[0]["skipped"]}]
    return [{"part": "torchrec", "obtained": "measured", "ranks": len(out), "n_items": n_items, "d_model": d,
             "ids": sum(o["ids"] for o in out), **{k: all(o[k] for o in out) for k in ("rows_equal", "rows_equal_table",
                                                                                     "same_shard")},
             "torchrec_s": max(o["torchrec_s"] for o in out), "grlib_s": max(o["grlib_s"] for o in out)}]
