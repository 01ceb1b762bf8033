"""TorchRec as a peer for grlib's row-sharded item table (issue 15, claim C3): the same table sharded
ROW-WISE by TorchRec's own planner and looked up through TorchRec's own input/output distribution.

    ok, why = available()                      # (False, "torchrec is not installed: ...") without it
    rowwise_block(100_000, 2)                  # [(0, 50000), (50000, 100000)]: read from TorchRec's plan
    out = rowwise_lookup(rt, table, ids)       # on every rank of a launch(): the same [V, d] table,
    out["rows"]                                # this rank's ids [N] -> [N, d], equal to table[ids] bitwise
    out["shard_rows"], out["seconds"]          # this rank's (start, stop), read from its local shard;
                                               # the median wall time of a lookup

rowwise_lookup builds, on each rank, a TorchRec EmbeddingCollection with one table (V, d) on the meta
device, attaches a fused SGD with `lr` (apply_optimizer_in_backward, before planning: the FUSED
kernel takes its optimizer from there), plans it with EmbeddingShardingPlanner restricted to ROW_WISE
+ FUSED on world x cpu, shards it over runtime.world_group (shard_modules), copies rows [start, stop)
of `table` into the local shard and looks up `ids` as one jagged sequence of one feature: batch size
1 on every rank, so ranks may hold different numbers of ids, none included. TorchRec's row blocks are
ceil(V / world) rows each, the last ones shorter or empty ([2, 2, 1, 0] for V=5 on 4 ranks);
rowwise_block reports them without a process group, so grlib's table can be sharded the same way.

Limits of TorchRec 1.8.0 with fbgemm-gpu-cpu 1.8.0 on CPU, refused here with a clear error: the
embedding dim must be a multiple of 4 (fbgemm's TBE); a rank whose block is empty (V=1 on 2 ranks)
fails inside fbgemm ("weights[0] must be a GPU or MTIA tensor"). The fused optimizer is SGD: fbgemm's
CPU kernel refuses Adam ("not supported in CPU mode"), and with Adagrad the rows copied in through the
state_dict did not come back from the lookup. The DENSE kernel and data-parallel sharding do not work
on CPU at all, hence FUSED + ROW_WISE.

TorchRec's wheel requires the CUDA fbgemm-gpu, which must never be installed beside fbgemm-gpu-cpu:
pyproject's [torchrec] extra holds TorchRec's other dependencies and `make setup-torchrec` installs
torchrec itself with --no-deps. Nothing here imports torchrec at module level: without it this
module imports and available() says why.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from grlib.distributed.topology import Runtime

TABLE = "item_table"  # not "items": EmbeddingCollection keeps its tables in an nn.ModuleDict
FEATURE = "item_id"
INSTALL_HINT = "make setup-torchrec (pip install -e '.[cpu,torchrec]', then pip install --no-deps torchrec==1.8.0)"
_MODULES = ("torchrec", "torchrec.distributed", "torchrec.distributed.planner", "torchrec.optim")


def available() -> tuple[bool, str]:
    """(True, "") when torchrec and the parts used here import; else (False, why, with the error)."""
    for name in _MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == "torchrec":
                return False, f"torchrec is not installed: {INSTALL_HINT}"
            return False, f"torchrec fails to import ({name}): {type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001  (any import failure is the reason, reported verbatim)
            return False, f"torchrec fails to import ({name}): {type(exc).__name__}: {exc}"
    return True, ""


def _require() -> None:
    ok, why = available()
    if not ok:
        raise ImportError(why)


def _check_sizes(V: int, d: int, world: int) -> None:
    for name, value in (("V", V), ("d", d), ("world", world)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an integer >= 1")
    if d % 4:
        raise ValueError(f"d={d}: TorchRec's FUSED kernel (fbgemm's TBE) needs an embedding dim that is a "
                         f"multiple of 4 (e.g. {d + 4 - d % 4})")


def _collection(V: int, d: int, lr: float) -> torch.nn.Module:
    """A one-table EmbeddingCollection on the meta device with its fused SGD attached."""
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    ec = EmbeddingCollection(tables=[EmbeddingConfig(name=TABLE, embedding_dim=d, num_embeddings=V,
                                                     feature_names=[FEATURE])], device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.SGD, ec.parameters(), {"lr": lr})
    return ec


def _plan(ec: torch.nn.Module, world: int, local_world: int) -> tuple[Any, list[Any]]:
    """TorchRec's plan for `ec` on world x cpu, ROW_WISE + FUSED only; (plan, sharders)."""
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
    from torchrec.distributed.types import ShardingType

    constraints = {TABLE: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value],
                                               compute_kernels=[EmbeddingComputeKernel.FUSED.value])}
    topology = TopologyFactory.create_topology(TrainerConfig(world_size=world, local_world_size=local_world),
                                               kernel_config=KernelConfig(compute_device="cpu"))
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints, debug=False,
                                       storage_reservation=FixedPercentageStorageReservation(0.0))
    sharders: list[Any] = [EmbeddingCollectionSharder()]
    return planner.plan(ec, sharders), sharders


def _plan_blocks(plan: Any, world: int) -> list[tuple[int, int]]:
    """Each rank's (start, stop) rows of TABLE, from the plan's sharding spec (placements name ranks)."""
    sharding = plan.plan[""][TABLE]
    if sharding.sharding_type != "row_wise":
        raise RuntimeError(f"TorchRec planned {sharding.sharding_type!r} for {TABLE!r}, not 'row_wise'")
    blocks: dict[int, tuple[int, int]] = {}
    for shard in sharding.sharding_spec.shards:
        start = int(shard.shard_offsets[0])
        blocks[shard.placement.rank()] = (start, start + int(shard.shard_sizes[0]))
    if sorted(blocks) != list(range(world)):
        raise RuntimeError(f"TorchRec's plan places shards on ranks {sorted(blocks)}, expected 0..{world - 1}")
    return [blocks[r] for r in range(world)]


def rowwise_block(V: int, world: int, *, local_world: int | None = None) -> list[tuple[int, int]]:
    """The (start, stop) rows TorchRec's planner gives each rank of `world` for a ROW_WISE table of V
    rows, in rank order (planned in this process, no process group needed; empty blocks included).
    Shard grlib's table with these to compare the two shard for shard."""
    _require()
    _check_sizes(V, 4, world)
    plan, _ = _plan(_collection(V, 4, 0.0), world, local_world or world)
    return _plan_blocks(plan, world)


def _check_same_table(runtime: Runtime, V: int, d: int) -> None:
    """Every rank must pass a table of the same shape (else TorchRec would hang or mis-shard)."""
    shapes = [torch.zeros(2, dtype=torch.int64) for _ in range(runtime.topology.world)]  # world x [2]
    dist.all_gather(shapes, torch.tensor([V, d], dtype=torch.int64), group=runtime.world_group)
    seen = [tuple(int(v) for v in s) for s in shapes]
    if len(set(seen)) != 1:
        raise ValueError(f"table: shapes (V, d) differ across ranks {seen}; pass the same full [V, d] table "
                         "on every rank")


def _load_rows(sharded: torch.nn.Module, table: Tensor) -> tuple[int, int]:
    """Copy table's rows into this rank's shard; its (start, stop), read from the shard's metadata."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    weights = [v for k, v in sharded.state_dict().items() if k.endswith(f"{TABLE}.weight")]
    if len(weights) != 1 or not isinstance(weights[0], ShardedTensor):
        raise RuntimeError(f"expected one ShardedTensor for {TABLE!r} in the sharded module's state_dict, got "
                           f"{[type(w).__name__ for w in weights]}")
    shards = weights[0].local_shards()
    if len(shards) != 1:
        raise RuntimeError(f"row-wise sharding gave this rank {len(shards)} shards, expected 1")
    meta = shards[0].metadata
    (start, col), (rows, cols) = meta.shard_offsets, meta.shard_sizes
    if (col, cols) != (0, table.shape[1]):
        raise RuntimeError(f"the shard holds columns [{col}, {col + cols}), expected all {table.shape[1]}")
    with torch.no_grad():
        shards[0].tensor.copy_(table[start:start + rows])  # a view of the FUSED kernel's weights
    return (int(start), int(start + rows))


def rowwise_lookup(runtime: Runtime, table: Tensor, ids: Tensor, *, lr: float = 0.0, repeats: int = 5) -> dict:
    """On every rank (a collective): shard `table` [V, d] float32 (the same on every rank) ROW-WISE with
    TorchRec, look up this rank's `ids` [N] int64 in [0, V). Returns {"rows": [N, d] float32, "shard_rows":
    (start, stop) of this rank's shard, "seconds": median wall time of `repeats` lookups after a warm-up}.
    A lookup is TorchRec's forward: ids to their owners (all-to-all), the FUSED kernel, rows back."""
    _require()
    from torchrec.distributed.shard import shard_modules
    from torchrec.distributed.types import Awaitable, ShardingEnv
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if table.dim() != 2 or table.dtype != torch.float32:
        raise ValueError(f"table: expected a 2-D float32 tensor [V, d], got {table.dtype} {tuple(table.shape)}")
    if ids.dim() != 1 or ids.dtype != torch.int64:
        raise ValueError(f"ids: expected a 1-D int64 tensor [N], got {ids.dtype} {tuple(ids.shape)}")
    V, d = (int(s) for s in table.shape)
    topo = runtime.topology
    _check_sizes(V, d, topo.world)
    if ids.numel() and not (int(ids.min()) >= 0 and int(ids.max()) < V):
        raise ValueError(f"ids: expected values in [0, V={V}), got [{int(ids.min())}, {int(ids.max())}]")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: expected an integer >= 1")
    if not lr >= 0:
        raise ValueError(f"lr={lr!r}: expected a learning rate >= 0")
    if runtime.world_group is None:
        raise ValueError(f"runtime: world={topo.world} has no process group; run rowwise_lookup on >= 2 ranks "
                         "(grlib.distributed.launch(fn, world=2) or torchrun)")
    _check_same_table(runtime, V, d)

    ec = _collection(V, d, lr)
    plan, sharders = _plan(ec, topo.world, topo.local_world)
    blocks = _plan_blocks(plan, topo.world)
    empty = [r for r, (start, stop) in enumerate(blocks) if stop == start]
    if empty:
        raise ValueError(f"V={V} on world={topo.world}: TorchRec's row blocks {blocks} leave ranks {empty} without "
                         "rows, and fbgemm's CPU kernel fails on an empty shard; use V > ceil(V / world) * "
                         "(world - 1) (for example V >= world * world)")
    sharded = shard_modules(ec, env=ShardingEnv.from_process_group(runtime.world_group),
                            device=torch.device("cpu"), plan=plan, sharders=sharders)
    shard_rows = _load_rows(sharded, table.contiguous())
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[FEATURE], values=ids,
                                              lengths=torch.tensor([ids.numel()], dtype=torch.int32))

    def lookup() -> Tensor:
        out = sharded(kjt)
        out = out.wait() if isinstance(out, Awaitable) else out
        return out[FEATURE].values()  # [N, d]

    with torch.no_grad():
        rows = lookup().clone()
        seconds = runtime.timed(lookup, repeats)
    return {"rows": rows, "shard_rows": shard_rows, "seconds": seconds}
