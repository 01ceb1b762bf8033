"""Who is who in a multi-process run, and the process groups that connect the ranks.

    topo = Topology.from_env()          # torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
    rt = init_runtime(topo)             # backend "auto": nccl (CUDA), hccl (torch_npu), else gloo
    dist.all_reduce(x, group=rt.intra_group)   # the ranks of my node
    dist.all_reduce(x, group=rt.cross_group)   # the ranks with my local_rank, one per node
    rt.close()

Ranks are laid out node by node, as torchrun numbers them: node n holds ranks
[n * local_world, (n + 1) * local_world), and rank r is local rank r % local_world of node
r // local_world. Every node runs the same number of ranks (local_world); nodes = world // local_world.
LOCAL_WORLD_SIZE lets processes on one machine act as several nodes (4 processes as 2 nodes x 2).

init_runtime on one process (world == 1) creates no process group at all: the Runtime's groups are
None and barrier/close do nothing, so single-process code needs no gloo. On CPU it first sets torch's
intra-op threads (one per rank by default), since ranks sharing a machine share its cores.
"""
from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl", "hccl")
_ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class TopologyError(ValueError):
    """A bad world size or rank layout; the message names what is wrong and the valid choices."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_world(world: int, nodes: int = 1) -> None:
    """Refuse a world that cannot be split into `nodes` equal nodes (TopologyError, with the choices)."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise TopologyError(f"world={world!r}: expected an integer >= 1 (the number of processes)")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise TopologyError(f"nodes={nodes!r}: expected an integer >= 1 dividing world={world} "
                            f"(valid: {_divisors(world)})")
    if world % nodes:
        raise TopologyError(f"world={world} cannot be split into nodes={nodes} equal nodes: nodes must "
                            f"divide world (valid nodes for world={world}: {_divisors(world)}; "
                            f"valid worlds for nodes={nodes}: multiples of {nodes})")


@dataclass(frozen=True)
class Topology:
    """This process's place: `rank` of `world`, `local_rank` of the `local_world` ranks of its node."""
    world: int
    rank: int
    local_world: int
    local_rank: int

    def __post_init__(self) -> None:
        for name in ("world", "local_world"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TopologyError(f"{name}={value!r}: expected an integer >= 1")
        if self.world % self.local_world:
            raise TopologyError(f"local_world={self.local_world} does not divide world={self.world} "
                                f"(valid local_world: {_divisors(self.world)})")
        if not 0 <= self.rank < self.world:
            raise TopologyError(f"rank={self.rank}: expected 0 <= rank < world={self.world}")
        if self.local_rank != self.rank % self.local_world:
            raise TopologyError(f"local_rank={self.local_rank}: rank {self.rank} with local_world="
                                f"{self.local_world} is local rank {self.rank % self.local_world}")

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    @property
    def node(self) -> int:
        return self.rank // self.local_world

    def node_ranks(self, node: int) -> list[int]:
        """The ranks of node `node`, in order."""
        if not 0 <= node < self.nodes:
            raise TopologyError(f"node={node}: expected 0 <= node < nodes={self.nodes}")
        return list(range(node * self.local_world, (node + 1) * self.local_world))

    def peers_with_local_rank(self, local_rank: int) -> list[int]:
        """The ranks that are local rank `local_rank` of their node, one per node, in node order."""
        if not 0 <= local_rank < self.local_world:
            raise TopologyError(f"local_rank={local_rank}: expected 0 <= local_rank < local_world={self.local_world}")
        return list(range(local_rank, self.world, self.local_world))

    def as_dict(self) -> dict[str, int]:
        """The shape of the run, for result rows (the same on every rank)."""
        return {"world": self.world, "nodes": self.nodes, "local_world": self.local_world}

    @classmethod
    def single(cls) -> Topology:
        return cls(world=1, rank=0, local_world=1, local_rank=0)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Topology:
        """Read torchrun's variables; none of RANK/WORLD_SIZE set -> a single process. LOCAL_WORLD_SIZE
        defaults to WORLD_SIZE (one node) and LOCAL_RANK to RANK % LOCAL_WORLD_SIZE; GROUP_RANK (the
        node, when set) must equal RANK // LOCAL_WORLD_SIZE."""
        if "RANK" not in env and "WORLD_SIZE" not in env:
            extra = [name for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK") if name in env]
            if extra:
                raise TopologyError(f"{extra[0]} is set but RANK and WORLD_SIZE are not: set all of "
                                    f"{', '.join(_ENV_VARS)} (as torchrun does) or none")
            return cls.single()
        for name in ("RANK", "WORLD_SIZE"):
            if name not in env:
                raise TopologyError(f"{name} is not set while {'WORLD_SIZE' if name == 'RANK' else 'RANK'} "
                                    f"is: set both (torchrun sets {', '.join(_ENV_VARS)})")
        world = _env_int(env, "WORLD_SIZE", low=1)
        rank = _env_int(env, "RANK", low=0)
        if rank >= world:
            raise TopologyError(f"RANK={rank}: expected 0 <= RANK < WORLD_SIZE={world}")
        local_world = _env_int(env, "LOCAL_WORLD_SIZE", low=1, default=world)
        if world % local_world:
            raise TopologyError(f"LOCAL_WORLD_SIZE={local_world} does not divide WORLD_SIZE={world}: every "
                                f"node runs the same number of ranks (valid: {_divisors(world)})")
        local_rank = _env_int(env, "LOCAL_RANK", low=0, default=rank % local_world)
        if local_rank != rank % local_world:
            raise TopologyError(f"LOCAL_RANK={local_rank} is inconsistent with RANK={rank} and LOCAL_WORLD_SIZE="
                                f"{local_world}: expected {rank % local_world} (ranks are numbered node by node)")
        if "GROUP_RANK" in env:
            group_rank = _env_int(env, "GROUP_RANK", low=0)
            if group_rank != rank // local_world:
                raise TopologyError(f"GROUP_RANK={group_rank} is inconsistent with RANK={rank} and LOCAL_WORLD_SIZE="
                                    f"{local_world}: expected node {rank // local_world}")
        return cls(world=world, rank=rank, local_world=local_world, local_rank=local_rank)


def _env_int(env: Mapping[str, str], name: str, *, low: int, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None:
        assert default is not None, name
        return default
    try:
        value = int(raw)
    except ValueError:
        raise TopologyError(f"{name}={raw!r}: expected an integer >= {low}") from None
    if value < low:
        raise TopologyError(f"{name}={value}: expected an integer >= {low}")
    return value


def is_distributed() -> bool:
    """Whether a default process group is initialised in this process."""
    return dist.is_available() and dist.is_initialized()


@dataclass
class Runtime:
    """An initialised process group and its subgroups (all None when world == 1).

    intra_group: the ranks of my node; cross_group: the ranks with my local_rank, one per node."""
    topology: Topology
    backend: str
    device: torch.device
    world_group: Any = None
    intra_group: Any = None
    cross_group: Any = None
    _open: bool = field(default=True, repr=False)

    def barrier(self) -> None:
        if not self._open:
            raise RuntimeError("Runtime.barrier after close()")
        if self.world_group is None:
            return
        if self.backend == "nccl":
            dist.barrier(group=self.world_group, device_ids=[self.device.index])
        else:
            dist.barrier(group=self.world_group)

    def timed(self, collective: Callable[[], object], repeats: int) -> float:
        """Median wall seconds of `repeats` calls of `collective`, each started after a barrier (every
        rank calls it the same number of times)."""
        if repeats < 1:
            raise ValueError(f"Runtime.timed: repeats must be >= 1, got {repeats}")
        times = []
        for _ in range(repeats):
            self.barrier()
            start = time.perf_counter()
            collective()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def close(self, barrier: bool = True) -> None:
        """Destroy the process group and its subgroups (idempotent). With `barrier` (a normal end),
        every rank first passes its last collective: gloo ranks that tore their pairs down while a
        peer still used them aborted at exit ("terminate called without an active exception"); after
        an error no barrier is waited for (a failed peer would never reach it)."""
        if self._open and self.world_group is not None and is_distributed():
            if barrier:
                dist.barrier()
            dist.destroy_process_group()
        self._open = False

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(barrier=exc[0] is None)


def _resolve_backend(backend: str, local_rank: int) -> tuple[str, torch.device]:
    """(backend, device) for this rank; a requested accelerator that is missing is an error."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if backend == "auto":
        if torch.cuda.is_available():
            backend = "nccl"
        elif importlib.util.find_spec("torch_npu") is not None and _npu_available():
            backend = "hccl"
        else:
            backend = "gloo"
    if backend == "gloo":
        return backend, torch.device("cpu")
    if backend == "nccl":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        kind = "cuda"
    else:
        if importlib.util.find_spec("torch_npu") is None:
            raise ValueError("backend='hccl' needs torch_npu (Ascend's torch plugin), which is not installed: "
                             f"use one of {BACKENDS} that this machine has")
        count = torch.npu.device_count() if _npu_available() else 0  # type: ignore[attr-defined]
        kind = "npu"
    if local_rank >= count:
        raise TopologyError(f"backend={backend!r} on local rank {local_rank} needs {local_rank + 1} {kind} "
                            f"device(s) per node, {count} visible: run at most {count} rank(s) per node "
                            f"(LOCAL_WORLD_SIZE) or use backend='gloo'")
    return backend, torch.device(kind, local_rank)


def _npu_available() -> bool:
    """Whether torch_npu is installed and sees an Ascend NPU (importing it registers torch.npu)."""
    if importlib.util.find_spec("torch_npu") is None:
        return False
    importlib.import_module("torch_npu")
    return bool(torch.npu.is_available())  # type: ignore[attr-defined]


def init_runtime(topology: Topology | None = None, *, backend: str = "auto", timeout_s: float = 120.0,
                 threads: int | None = 1) -> Runtime:
    """Join the process group of `topology` (default: Topology.from_env()) and build its subgroups.

    threads: torch's intra-op threads on CPU (None leaves them); timeout_s: how long a collective or
    the rendezvous waits for a missing rank before it raises. MASTER_ADDR/MASTER_PORT locate rank 0."""
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads={threads!r}: expected an integer >= 1, or None to keep torch's count")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: expected seconds > 0")
    topo = Topology.from_env() if topology is None else topology
    backend, device = _resolve_backend(backend, topo.local_rank)
    if device.type == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":
        torch.npu.set_device(device)  # type: ignore[attr-defined]
    if topo.world == 1:
        return Runtime(topology=topo, backend=backend, device=device)
    if is_distributed():
        raise RuntimeError("a process group is already initialised in this process: close its Runtime "
                           "(or torch.distributed.destroy_process_group()) before init_runtime")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise TopologyError(f"{' and '.join(missing)} not set: with world={topo.world} every rank must know "
                            f"where rank 0 listens (torchrun and grlib.distributed.launch set them)")
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, init_method="env://", world_size=topo.world, rank=topo.rank,
                            timeout=timeout, device_id=device if backend == "nccl" else None)
    # new_group is collective: every rank creates every group, in the same order, and keeps its own
    intra = cross = None
    for node in range(topo.nodes):
        group = _group(topo.node_ranks(node), topo.world, timeout)
        if node == topo.node:
            intra = group
    for local_rank in range(topo.local_world):
        group = _group(topo.peers_with_local_rank(local_rank), topo.world, timeout)
        if local_rank == topo.local_rank:
            cross = group
    return Runtime(topology=topo, backend=backend, device=device, world_group=dist.group.WORLD,
                   intra_group=intra, cross_group=cross)


def _group(ranks: list[int], world: int, timeout: datetime.timedelta) -> Any:
    """The world group itself when `ranks` are all ranks, else a new subgroup (a collective call)."""
    return dist.group.WORLD if len(ranks) == world else dist.new_group(ranks=ranks, timeout=timeout)


def side_channel(runtime: Runtime, timeout_s: float = 300.0) -> Runtime:
    """A Runtime over the same ranks with groups of its own (world, node, cross), so that a second
    thread can run collectives while the main thread runs its own (a collective call: every rank
    calls it, in the same order). Its close() leaves the process group to `runtime`."""
    topo = runtime.topology
    if topo.world == 1:
        return Runtime(topology=topo, backend=runtime.backend, device=runtime.device, _open=False)
    timeout = datetime.timedelta(seconds=timeout_s)
    world = dist.new_group(ranks=list(range(topo.world)), timeout=timeout)
    intra = cross = None
    for node in range(topo.nodes):
        group = dist.new_group(ranks=topo.node_ranks(node), timeout=timeout)
        if node == topo.node:
            intra = group
    for local_rank in range(topo.local_world):
        group = dist.new_group(ranks=topo.peers_with_local_rank(local_rank), timeout=timeout)
        if local_rank == topo.local_rank:
            cross = group
    return Runtime(topology=topo, backend=runtime.backend, device=runtime.device, world_group=world,
                   intra_group=intra, cross_group=cross, _open=False)
