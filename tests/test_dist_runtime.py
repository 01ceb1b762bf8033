"""grlib.distributed's runtime: topology from torchrun's variables, process groups and subgroups on gloo,
launch() collecting results in rank order, and failing ranks (raised, killed, hung) ending the run
with RankFailed in bounded time and no process left behind. The functions the ranks run are at
module level: spawned children import this module to unpickle them."""
from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grlib  # noqa: F401  (first: sets the OpenMP wait policy before torch loads)
import psutil
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from grlib.distributed import (
    RankFailed,
    Runtime,
    Topology,
    TopologyError,
    check_world,
    free_port,
    init_runtime,
    is_distributed,
    launch,
)

LIVENESS_S = 60.0  # a failing run must end within this (no hang); not a speed bound


# --- what the ranks run -------------------------------------------------------------------------

def _gather(value: float, group: object, size: int) -> list[float]:
    out = [torch.zeros(1) for _ in range(size)]  # size x [1] float32
    dist.all_gather(out, torch.tensor([value]), group=group)
    return [float(t) for t in out]


def _collectives(rt: Runtime, scale: float, *, offset: float) -> dict:
    topo = rt.topology
    x = torch.tensor([float(topo.rank)])  # [1]
    dist.all_reduce(x)
    rt.barrier()
    return {"topology": topo, "node": topo.node, "sum": float(x) * scale + offset,
            "world": _gather(float(topo.rank), rt.world_group, topo.world),
            "intra": _gather(float(topo.rank), rt.intra_group, topo.local_world),
            "cross": _gather(float(topo.rank), rt.cross_group, topo.nodes),
            "threads": torch.get_num_threads(), "backend": rt.backend, "device": str(rt.device),
            "env": os.environ.get("GRLIB_TEST_MARK")}


def _raise_on_one(rt: Runtime) -> int:
    if rt.topology.rank == 1:
        raise ValueError("rank one broke on purpose")
    dist.all_reduce(torch.ones(1))  # waits for rank 1, which never comes
    return 0


def _raise_on_one_while_zero_sleeps(rt: Runtime) -> int:
    if rt.topology.rank == 1:
        raise ValueError("rank one broke on purpose")
    time.sleep(600)  # in no collective: only the launcher can end it (a stuck rank, not a timing)
    return 0


def _sleep(rt: Runtime) -> int:
    time.sleep(600)  # a rank that never returns: the launcher's timeout_s must end it
    return 0


def _kill_one(rt: Runtime, stamp: str) -> int:
    rt.barrier()  # both ranks are up; rank 0 then waits in the all_reduce below
    if rt.topology.rank == 1:
        Path(stamp).write_text(repr(time.time()))  # when it died: the liveness bound below starts here
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
    return 0


def _exit_quietly_on_one(rt: Runtime) -> int:
    if rt.topology.rank == 1:
        os._exit(0)
    return 0


def _assert_no_rank_left() -> None:
    assert multiprocessing.active_children() == []
    ranks = [p for p in psutil.Process().children(recursive=True)
             if p.status() == psutil.STATUS_ZOMBIE or "spawn_main" in " ".join(p.cmdline())]
    assert ranks == []


# --- launch: results, topology, subgroups -------------------------------------------------------

def test_two_ranks_collectives_in_rank_order():
    rows = launch(_collectives, 2, args=(10.0,), kwargs={"offset": 0.5}, env={"GRLIB_TEST_MARK": "seen"})
    assert [r["topology"] for r in rows] == [Topology(2, 0, 2, 0), Topology(2, 1, 2, 1)]
    assert [r["sum"] for r in rows] == [10.5, 10.5]  # (0 + 1) * 10 + 0.5
    assert all(r["world"] == [0.0, 1.0] and r["intra"] == [0.0, 1.0] for r in rows)
    assert [r["cross"] for r in rows] == [[0.0], [1.0]]  # one node: each rank alone across nodes
    assert all(r["threads"] == 1 and r["backend"] == "gloo" and r["device"] == "cpu" for r in rows)
    assert all(r["env"] == "seen" for r in rows)
    _assert_no_rank_left()


def test_four_ranks_as_two_nodes_of_two():
    rows = launch(_collectives, 4, nodes=2, args=(1.0,), kwargs={"offset": 0.0})
    assert [r["node"] for r in rows] == [0, 0, 1, 1]
    assert [r["topology"].local_rank for r in rows] == [0, 1, 0, 1]
    assert all(r["topology"].as_dict() == {"world": 4, "nodes": 2, "local_world": 2} for r in rows)
    assert all(r["sum"] == 6.0 and r["world"] == [0.0, 1.0, 2.0, 3.0] for r in rows)
    assert [r["intra"] for r in rows] == [[0.0, 1.0], [0.0, 1.0], [2.0, 3.0], [2.0, 3.0]]
    assert [r["cross"] for r in rows] == [[0.0, 2.0], [1.0, 3.0], [0.0, 2.0], [1.0, 3.0]]


# --- launch: failures end the run ---------------------------------------------------------------

def test_rank_that_raises_is_named():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(_raise_on_one, 2, grace_s=5.0)
    assert time.monotonic() - start < LIVENESS_S  # a liveness bound (a hang fails), not a speed
    assert next(iter(info.value.failed)) == 1
    assert "first rank 1" in str(info.value) and "ValueError: rank one broke on purpose" in str(info.value)
    _assert_no_rank_left()


def test_rank_stuck_outside_collectives_is_terminated_after_grace():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(_raise_on_one_while_zero_sleeps, 2, grace_s=1.0)
    assert time.monotonic() - start < LIVENESS_S  # a liveness bound (a hang fails), not a speed
    assert list(info.value.failed) == [1] and info.value.running == [0]
    assert "ranks [0] were still running" in str(info.value)
    _assert_no_rank_left()


def test_timeout_names_the_ranks_still_running():
    with pytest.raises(RankFailed, match=r"timed out after timeout_s=4 s: ranks \[0, 1\] still running") as info:
        launch(_sleep, 2, timeout_s=4.0)
    assert info.value.failed == {} and info.value.running == [0, 1]
    _assert_no_rank_left()


def test_killed_rank_is_named_and_nothing_is_left(tmp_path: Path):
    stamp = tmp_path / "killed_at"
    with pytest.raises(RankFailed) as info:
        launch(_kill_one, 2, args=(str(stamp),), grace_s=5.0)
    elapsed = time.time() - float(stamp.read_text())  # for the liveness bound (a hang fails), not a speed
    print(f"kill -> RankFailed: {elapsed:.3f} s")
    assert elapsed < LIVENESS_S
    assert "rank 1 was killed by SIGKILL" in str(info.value)
    assert 1 in info.value.failed and info.value.running == []
    _assert_no_rank_left()


def test_rank_exiting_without_result_is_a_failure():
    with pytest.raises(RankFailed, match="rank 1 exited with code 0 without returning a result"):
        launch(_exit_quietly_on_one, 2)
    _assert_no_rank_left()


def test_launch_refuses_bad_arguments_before_spawning():
    with pytest.raises(TopologyError, match=r"valid nodes for world=3: \[1, 3\]"):
        launch(_sleep, 3, nodes=2)
    with pytest.raises(ValueError, match="backend='mpi'"):
        launch(_sleep, 2, backend="mpi")
    with pytest.raises(ValueError, match=r"env sets \['RANK'\]"):
        launch(_sleep, 2, env={"RANK": "0"})
    _assert_no_rank_left()


# --- topology without processes -----------------------------------------------------------------

@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_topology_from_env_layout(nodes: int, local_world: int, data: st.DataObject):
    world = nodes * local_world
    rank = data.draw(st.integers(0, world - 1))
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % local_world),
           "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(rank // local_world)}
    topo = Topology.from_env(env)
    assert topo == Topology(world, rank, local_world, rank % local_world) and topo.nodes == nodes
    by_node = [topo.node_ranks(n) for n in range(nodes)]
    by_local = [topo.peers_with_local_rank(lr) for lr in range(local_world)]
    assert sorted(sum(by_node, [])) == sorted(sum(by_local, [])) == list(range(world))
    assert rank in by_node[topo.node] and rank in by_local[topo.local_rank]
    assert all(len(set(a) & set(b)) == 1 for a in by_node for b in by_local)  # a grid: one rank each
    assert Topology.from_env({k: v for k, v in env.items() if k in ("RANK", "WORLD_SIZE")}) == \
        Topology(world, rank, world, rank)  # without the local variables: one node


@given(st.integers(1, 36), st.integers(1, 36))
def test_check_world(world: int, nodes: int):
    if world % nodes == 0:
        check_world(world, nodes)
    else:
        with pytest.raises(TopologyError) as info:
            check_world(world, nodes)
        divisors = [d for d in range(1, world + 1) if world % d == 0]
        assert f"valid nodes for world={world}: {divisors}" in str(info.value)


def test_check_world_refuses_empty_worlds():
    for world, nodes in ((0, 1), (2, 0), (-1, 1)):
        with pytest.raises(TopologyError):
            check_world(world, nodes)


def test_topology_from_env_absent_is_single():
    assert Topology.from_env({}) == Topology.single() == Topology(1, 0, 1, 0)


@pytest.mark.parametrize(("env", "name"), [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
    ({"RANK": "0"}, "WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"),
    ({"LOCAL_RANK": "0"}, "LOCAL_RANK"),
    ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "3"}, "LOCAL_WORLD_SIZE"),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "LOCAL_RANK"),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1", "GROUP_RANK": "0"}, "GROUP_RANK"),
])
def test_topology_from_env_refuses_inconsistent_variables(env: dict, name: str):
    with pytest.raises(TopologyError) as info:
        Topology.from_env(env)
    assert str(info.value).startswith(name)


def test_single_process_runtime_has_no_process_group():
    rt = init_runtime(Topology.single(), backend="gloo", threads=None)
    assert (rt.world_group, rt.intra_group, rt.cross_group) == (None, None, None)
    assert rt.device == torch.device("cpu") and not is_distributed()
    rt.barrier()
    rt.close()
    rt.close()
    with pytest.raises(ValueError, match="backend='mpi'"):
        init_runtime(Topology.single(), backend="mpi", threads=None)


def test_free_port_is_bindable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


# --- torchrun -----------------------------------------------------------------------------------

TORCHRUN_SCRIPT = """
import grlib
import torch, torch.distributed as dist
from grlib.distributed import init_runtime
rt = init_runtime()
x = torch.tensor([float(rt.topology.rank + 1)])
dist.all_reduce(x)
print(f"rank {rt.topology.rank} of {rt.topology.world} node {rt.topology.node} sum {float(x)} {rt.backend}", flush=True)
rt.close()
"""


def test_torchrun_runs_init_runtime(tmp_path: Path):
    script = tmp_path / "allreduce.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} of 2 node 0 sum 3.0 gloo" in proc.stdout
