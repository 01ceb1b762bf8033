"""grlib.distributed.sharded_embedding on gloo ranks (2, and 4 acting as 2 nodes x 2): the row-sharded item
table returns the rows of the unsharded table bit for bit in every exchange mode, its shards after 3
lazy-Adam steps gather to the single-process table, full-ranking evaluation over shards gives the
ranks of one process, and `train --world 2` with sharded items trains what one process trains."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grlib.distributed.launch import launch
from grlib.distributed.sharded_embedding import ShardedRows, gather_table, row_blocks, table_rows
from grlib.evaluate import ranks_from_scores
from grlib.train.optim import LazyAdam

V, D = 37, 6
MODES = [("flat", "none"), ("flat", "rank"), ("hierarchical", "none"), ("hierarchical", "rank"),
         ("hierarchical", "node")]


def _table() -> torch.Tensor:
    return torch.randn(V, D, generator=torch.Generator().manual_seed(0))


def _ids(rank: int, step: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    n = [0, 1, 23, 60][(rank + step) % 4]  # ranks with no id, one id, many (repeats included)
    return torch.randint(0, V, (n,), generator=g)


def _weights(rank: int, step: int, n: int) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(7 + 100 * step + rank))


def _lookups_and_steps(runtime, steps: int = 3):
    """Each mode: the rows of this rank's ids, then 3 lazy-Adam steps on sum(rows * w); the shard."""
    out = {}
    for mode, dedup in MODES:
        if dedup == "node" and mode != "hierarchical":
            continue
        table = ShardedRows(_table(), runtime, mode, dedup, padding_idx=None)
        opt = LazyAdam([table.weight], lr=0.1)
        rows = table(_ids(runtime.topology.rank)).detach()
        for step in range(steps):
            opt.zero_grad()
            ids = _ids(runtime.topology.rank, step)
            (table(ids) * _weights(runtime.topology.rank, step, ids.numel())).sum().backward()
            opt.step()
        out[(mode, dedup)] = {"rows": rows, "shard": table.weight.detach().clone(), "bounds": table.bounds}
    return out


def _single_process(world: int, steps: int = 3) -> torch.Tensor:
    """The table after the same steps on one process: every rank's loss summed."""
    weight = torch.nn.Parameter(_table())
    opt = LazyAdam([weight], lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        loss = sum((weight[_ids(r, step)] * _weights(r, step, _ids(r, step).numel())).sum() for r in range(world))
        loss.backward()
        opt.step()
    return weight.detach()


@pytest.mark.parametrize("world,nodes", [(2, 1), (4, 2)])
def test_sharded_lookup_and_lazy_adam_match_one_table(world, nodes):
    got = launch(_lookups_and_steps, world, nodes=nodes, timeout_s=120)
    want = _single_process(world)
    for key in got[0]:
        for r in range(world):
            assert torch.equal(got[r][key]["rows"], _table()[_ids(r)]), (key, r)  # bit for bit
        assert got[0][key]["bounds"] == row_blocks(V, world)
        table = gather_table([got[r][key]["shard"] for r in range(world)])
        torch.testing.assert_close(table, want, atol=1e-6, rtol=0), key


def _shard_ranks(runtime, scores: torch.Tensor, targets: torch.Tensor, history):
    from grlib.evaluate import ShardScores, ranks_from_shards
    from grlib.distributed.sharded_embedding import sum_over

    start, stop = row_blocks(scores.shape[1], runtime.topology.world)[runtime.topology.rank]
    shard = ShardScores(scores[:, start:stop], start, scores.shape[1], sum_over(runtime.world_group))
    return ranks_from_shards(shard, targets, history)


def test_ranks_over_shards_equal_the_ranks_of_one_process():
    g = torch.Generator().manual_seed(3)
    B, n = 9, 41
    scores = torch.randint(0, 5, (B, n), generator=g).float()  # many ties
    targets = torch.randint(2, n, (B,), generator=g)
    history = [np.array([i for i in range(2, n, b + 2) if i != int(targets[b])], dtype=np.int64) for b in range(B)]
    want = ranks_from_scores(scores, targets, history)
    for world in (2, 3):
        got = launch(_shard_ranks, world, args=(scores, targets, history), timeout_s=120)
        for r in got:
            assert torch.equal(r, want)
    assert torch.equal(launch(_shard_ranks, 2, args=(scores, targets, None))[0], ranks_from_scores(scores, targets))


def test_checkpoint_tables_move_between_world_sizes():
    table = _table()
    two = [table_rows(table, 2, r) for r in range(2)]
    assert torch.equal(gather_table(two), table)  # 2 -> 1
    assert all(torch.equal(table_rows(gather_table(two), 2, r), two[r]) for r in range(2))  # 1 -> 2
    three = [table_rows(table, 3, r) for r in range(3)]
    assert torch.equal(gather_table(three), table) and [t.shape[0] for t in three] == [13, 13, 11]


@pytest.mark.parametrize("items,dedup,nodes", [("flat", "rank", 1), ("hierarchical", "node", 2)])
def test_training_with_sharded_items_equals_one_process(single_run, items, dedup, nodes, dp_smoke):
    from grlib.fit import fit_rank

    world = 2 * nodes
    cfg = dp_smoke().replace({"dist.world": world, "dist.nodes": nodes, "dist.balance": "lpt", "dist.items": items,
                              "dist.dedup": dedup})
    got = launch(fit_rank, world, nodes=nodes, args=(cfg, "scale", None, 0, False))
    losses = got[0]["losses"]
    assert len(losses) == 20
    assert np.max(np.abs(np.subtract(losses, single_run.losses))) <= 1e-5
    for k in ("test_ndcg@10", "test_hr@10", "test_mrr", "val_ndcg@10"):
        assert got[0]["row"][k] == pytest.approx(single_run.row[k], abs=1e-6), k
    assert got[0]["row"]["items"] == items and got[0]["row"]["params"] == single_run.row["params"]


def _fit(cfg, ckpt: str | None, every: int = 0):
    from grlib.data.catalog import load_dataset
    from grlib.fit import fit_and_evaluate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fit_and_evaluate(cfg, load_dataset(cfg, "scale"), None, checkpoint_dir=ckpt, checkpoint_every=every)
    finally:
        torch.set_num_threads(threads)


def test_sharded_checkpoints_resume_on_the_same_and_on_other_world_sizes(single_run, tmp_path, dp_smoke):
    """2 sharded ranks checkpoint at step 8 and resume to 20 (same world); their checkpoints resharded
    for one process resume there (2 -> 1); one process's checkpoint resharded for 2 ranks (1 -> 2).
    Every resumed run ends with the uninterrupted single-process losses and metrics."""
    from grlib.distributed.reshard import reshard
    from grlib.fit import fit_rank

    dist = {"dist.world": 2, "dist.balance": "kk", "dist.items": "flat"}
    two, one, back = (str(tmp_path / n) for n in ("two", "one", "back"))
    launch(fit_rank, 2, args=(dp_smoke(8).replace(dist), "scale", two, 4, False))
    assert [p.name for p in reshard(two, one, 1)] == ["last.pt"]  # 2 -> 1 at step 8
    resumed = launch(fit_rank, 2, args=(dp_smoke(20).replace(dist), "scale", two, 4, False))[0]  # same world
    assert resumed["row"]["resumed_from"] == 8
    assert np.max(np.abs(np.subtract(resumed["losses"], single_run.losses))) <= 1e-5
    fit = _fit(dp_smoke(20), one)
    assert fit.row["resumed_from"] == 8
    assert np.max(np.abs(np.subtract(fit.losses, single_run.losses))) <= 1e-5
    assert fit.row["test_ndcg@10"] == pytest.approx(single_run.row["test_ndcg@10"], abs=1e-6)

    _fit(dp_smoke(8), str(tmp_path / "single"), every=4)  # 1 -> 2 at step 8
    reshard(tmp_path / "single", back, 2)
    got = launch(fit_rank, 2, args=(dp_smoke(20).replace(dist), "scale", back, 4, False))[0]
    assert got["row"]["resumed_from"] == 8
    assert np.max(np.abs(np.subtract(got["losses"], single_run.losses))) <= 1e-5
    assert got["row"]["test_ndcg@10"] == pytest.approx(single_run.row["test_ndcg@10"], abs=1e-6)
