"""grlib.distributed.torchrec_peer: TorchRec's ROW_WISE sharded lookup on 2 gloo ranks returns table[ids]
bitwise for random ragged ids (none, one, duplicates, all owned by the other rank); its row blocks,
read from the plan and from each rank's shard, tile [0, V) in rank order; bad input is refused with
the parameter named. The TorchRec tests skip with available()'s reason where torchrec is absent (CI
installs .[cpu,test] only); the two tests without torchrec run everywhere. The rank functions are at
module level: spawned children import this module to unpickle them."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import grlib  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grlib.distributed import Runtime, Topology, init_runtime, launch
from grlib.distributed import torchrec_peer

with warnings.catch_warnings():  # importing TorchRec 1.8 warns of its own deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    OK, WHY = torchrec_peer.available()
needs_torchrec = pytest.mark.skipif(not OK, reason=WHY)
pytestmark = [pytest.mark.filterwarnings(f"ignore::DeprecationWarning:{module}")  # TorchRec 1.8's own, not grlib's
              for module in ("torchrec.*", "fbgemm_gpu.*", "torch.jit.*")]
WORLD = 2

# (V, d, ids of rank 0, ids of rank 1, seed): the cases every 2-rank run includes
EDGE_CASES = [
    (2, 4, [], [1], 0),               # the smallest table without an empty shard; no ids on rank 0
    (3, 4, [0], [0, 0, 0], 1),        # one id; duplicates; every id in rank 0's shard
    (5, 8, [4, 3], [], 2),            # rank 0 asks only for rank 1's rows
    (301, 64, list(range(300, -1, -7)), list(range(301)), 3),
]


def _table(V: int, d: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((V, d), dtype=np.float32))  # [V, d]


def _lookups(rt: Runtime, cases: list) -> dict:
    rank = rt.topology.rank
    results = []
    for V, d, ids0, ids1, seed in cases:
        ids = torch.tensor((ids0, ids1)[rank], dtype=torch.int64)  # [N]
        out = torchrec_peer.rowwise_lookup(rt, _table(V, d, seed), ids, lr=0.05, repeats=2)
        results.append(out)
    refusals = []
    for V in ((1, 1), (8, 12)):  # an empty shard on rank 1; tables that differ across ranks
        try:
            torchrec_peer.rowwise_lookup(rt, _table(V[rank], 4, 0), torch.zeros(1, dtype=torch.int64))
            refusals.append("")
        except ValueError as exc:
            refusals.append(str(exc))
    return {"results": results, "refusals": refusals}


@st.composite
def _case(draw: st.DrawFn) -> tuple:
    V = draw(st.integers(2, 400))
    d = draw(st.sampled_from([4, 8, 12, 64]))
    ids = [draw(st.lists(st.integers(0, V - 1), max_size=50)) for _ in range(WORLD)]
    return (V, d, ids[0], ids[1], draw(st.integers(0, 2**32 - 1)))


@needs_torchrec
@settings(max_examples=1)  # one 2-rank launch (~15 s on 2 shared cores): random cases + the edge cases
@given(st.lists(_case(), min_size=1, max_size=4))
def test_two_ranks_rowwise_lookup_matches_the_table(cases: list):
    cases = cases + EDGE_CASES
    ranks = launch(_lookups, WORLD, args=(cases,), timeout_s=240.0)
    for i, (V, d, ids0, ids1, seed) in enumerate(cases):
        table = _table(V, d, seed)
        outs = [r["results"][i] for r in ranks]
        for ids, out in zip((ids0, ids1), outs):
            assert out["rows"].dtype == torch.float32 and out["rows"].shape == (len(ids), d)
            assert torch.equal(out["rows"], table[torch.tensor(ids, dtype=torch.int64)])  # bitwise
            assert math.isfinite(out["seconds"]) and out["seconds"] > 0
        blocks = [out["shard_rows"] for out in outs]
        assert blocks == torchrec_peer.rowwise_block(V, WORLD)  # the shards agree with the plan
        assert blocks[0][0] == 0 and blocks[0][1] == blocks[1][0] and blocks[1][1] == V
    for r in ranks:
        empty, mismatch = r["refusals"]
        assert "V=1 on world=2" in empty and "leave ranks [1] without rows" in empty
        assert "table: shapes (V, d) differ across ranks [(8, 4), (12, 4)]" in mismatch


@needs_torchrec
@settings(max_examples=25)
@given(st.integers(1, 10**7), st.sampled_from([(1, 1), (2, 1), (2, 2), (3, 3), (4, 2), (8, 4), (7, 7)]))
def test_rowwise_blocks_tile_the_table_in_rank_order(V: int, world_local: tuple[int, int]):
    world, local_world = world_local
    blocks = torchrec_peer.rowwise_block(V, world, local_world=local_world)
    assert len(blocks) == world and blocks[0][0] == 0 and blocks[-1][1] == V
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))  # contiguous, in rank order
    sizes = [stop - start for start, stop in blocks]
    assert all(s >= 0 for s in sizes) and sizes == sorted(sizes, reverse=True)  # the short ones last
    assert sizes[0] == math.ceil(V / world)  # TorchRec's documented block: ceil(V / world) rows
    assert blocks == torchrec_peer.rowwise_block(V, world)  # the node layout moves no row


@needs_torchrec
@pytest.mark.parametrize(("table", "ids", "kwargs", "message"), [
    (torch.zeros(8, 4, dtype=torch.float64), [0], {}, "table: expected a 2-D float32"),
    (torch.zeros(8), [0], {}, "table: expected a 2-D float32"),
    (torch.zeros(8, 6), [0], {}, "d=6: TorchRec's FUSED kernel"),
    (torch.zeros(8, 4), [[0]], {}, "ids: expected a 1-D int64"),
    (torch.zeros(8, 4), [8], {}, r"ids: expected values in \[0, V=8\), got \[8, 8\]"),
    (torch.zeros(8, 4), [-1, 2], {}, r"ids: expected values in \[0, V=8\), got \[-1, 2\]"),
    (torch.zeros(8, 4), [0], {"repeats": 0}, "repeats=0"),
    (torch.zeros(8, 4), [0], {"lr": -1.0}, "lr=-1.0"),
    (torch.zeros(8, 4), [0], {}, "runtime: world=1 has no process group"),
])
def test_bad_input_is_refused_naming_the_parameter(table, ids, kwargs, message):
    rt = init_runtime(Topology.single(), backend="gloo", threads=None)
    with pytest.raises(ValueError, match=message):
        torchrec_peer.rowwise_lookup(rt, table, torch.tensor(ids, dtype=torch.int64), **kwargs)
    with pytest.raises(ValueError, match="ids: expected a 1-D int64"):
        torchrec_peer.rowwise_lookup(rt, torch.zeros(8, 4), torch.zeros(2, dtype=torch.int32))
    for V, world, name in ((0, 2, "V=0"), (8, 0, "world=0"), (8, True, "world=True")):
        with pytest.raises(ValueError, match=name):
            torchrec_peer.rowwise_block(V, world)


def test_without_torchrec_available_says_why(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "torchrec", None)  # import torchrec -> ModuleNotFoundError
    ok, why = torchrec_peer.available()
    assert not ok and why.startswith("torchrec is not installed: make setup-torchrec")
    with pytest.raises(ImportError, match="torchrec is not installed"):
        torchrec_peer.rowwise_block(8, 2)


def test_broken_torchrec_is_reported_and_the_module_still_imports(tmp_path: Path):
    (tmp_path / "torchrec").mkdir()
    (tmp_path / "torchrec" / "__init__.py").write_text("raise RuntimeError('broken build')\n")
    script = "import grlib.distributed.torchrec_peer as tp; print(tp.available())"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "(False, 'torchrec fails to import (torchrec): RuntimeError: broken build')"


def _grlib_and_torchrec(rt: Runtime) -> dict:
    """The same full table and ids through TorchRec's row-wise sharding and grlib's flat sharding."""
    from grlib.distributed.sharded_embedding import ShardedRows

    table = _table(1000, 16, seed=4)
    ids = torch.randint(0, 1000, (300 + 17 * rt.topology.rank,), generator=torch.Generator().manual_seed(rt.topology.rank))
    peer = torchrec_peer.rowwise_lookup(rt, table, ids, repeats=3)
    ours = ShardedRows(table, rt, "flat", "rank", padding_idx=None)
    with torch.no_grad():
        rows = ours(ids)
    return {"peer": peer["rows"], "ours": rows, "peer_rows": peer["shard_rows"], "our_rows": (ours.start, ours.stop),
            "want": table[ids]}


@needs_torchrec
def test_grlib_flat_sharding_returns_torchrecs_rows_with_its_row_blocks():
    for got in launch(_grlib_and_torchrec, 2, timeout_s=300):
        assert torch.equal(got["ours"], got["peer"]) and torch.equal(got["ours"], got["want"])
        assert got["our_rows"] == got["peer_rows"]  # the same block of rows on the same rank
