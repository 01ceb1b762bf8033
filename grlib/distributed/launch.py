"""Run a function on `world` local processes joined in one process group, and collect what each returns.

    def step(rt: Runtime, scale: float) -> float:      # module level: the children import it
        x = torch.full((1,), float(rt.topology.rank))
        dist.all_reduce(x)
        return scale * float(x)

    launch(step, world=4, nodes=2, args=(0.5,))         # -> [3.0, 3.0, 3.0, 3.0], in rank order

Each child is a fresh interpreter ('spawn': no torch state is forked; works from a notebook or a test)
with torchrun's variables set (MASTER_ADDR=127.0.0.1, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE = world // nodes, GROUP_RANK) plus `env`. The child wrapper calls
init_runtime(backend=..., timeout_s=...), runs fn(runtime, *args, **kwargs), sends the (picklable)
return value to the parent through a pipe and closes the runtime.

The parent watches every child. When one raises (its traceback is sent up) or dies (exit code != 0,
e.g. SIGKILL, or exit 0 without a result), the others get grace_s to finish or fail too, then are
terminated (SIGTERM, then SIGKILL), and RankFailed names the failed ranks, first detected first, with
the exit code or the end of the traceback. Past timeout_s the ranks still running are terminated and
RankFailed names them. Every child is joined before launch returns or raises (no zombie), and a child
whose parent disappears exits by itself (no orphan).

Trust: the only pickles here travel between this launcher and the children it spawned, never through
a file or a socket: multiprocessing hands fn, args and kwargs to each child over the pipe 'spawn'
opens to it, and each child sends its result back through an anonymous pipe (os.pipe: no name in
the file system, no port) whose two ends only this launcher and that child hold. What is unpickled
was pickled by a process running this launcher's own code, so it is as trusted as the caller.
Checkpoints, which a user can hand over, are read as data only (grlib.train.checkpoint).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from grlib.distributed.topology import BACKENDS, check_world, init_runtime

T = TypeVar("T")

_RESERVED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
_TRACEBACK_LINES = 20  # lines of a child's traceback quoted in RankFailed (its end: the exception)
_TERM_WAIT_S = 3.0     # after SIGTERM, before SIGKILL


class RankFailed(RuntimeError):
    """One or more ranks raised, died or outlived the timeout. failed: rank -> why (first detected
    first); running: the ranks that were still running and got terminated."""

    def __init__(self, message: str, failed: dict[int, str], running: list[int]) -> None:
        super().__init__(message)
        self.failed = failed
        self.running = running


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick; another process may take it before it is used)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(fn: Callable[..., T], world: int, *, nodes: int = 1, args: tuple = (), kwargs: dict | None = None,
           backend: str = "gloo", timeout_s: float = 300.0, grace_s: float = 10.0,
           env: dict[str, str] | None = None) -> list[T]:
    """fn(runtime, *args, **kwargs) on `world` spawned ranks (`nodes` x world // nodes); their return
    values in rank order. fn, args, kwargs and the results must be picklable (fn at module level)."""
    check_world(world, nodes)
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: expected one of {BACKENDS}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: expected seconds > 0")
    if not grace_s >= 0:
        raise ValueError(f"grace_s={grace_s!r}: expected seconds >= 0")
    extra = dict(env or {})
    clash = sorted(set(extra) & set(_RESERVED))
    if clash:
        raise ValueError(f"env sets {clash}, which launch sets itself ({', '.join(_RESERVED)}): "
                         "choose world and nodes instead")
    local_world = world // nodes
    port = free_port()
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    conns: dict[int, Connection] = {}
    try:
        for rank in range(world):
            child_env = {**{k: str(v) for k, v in extra.items()}, "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
                         "LOCAL_RANK": str(rank % local_world), "LOCAL_WORLD_SIZE": str(local_world),
                         "GROUP_RANK": str(rank // local_world)}
            # an anonymous os.pipe: no path or port that another process could write into (see _receive)
            reader, writer = ctx.Pipe(duplex=False)
            conns[rank] = reader
            proc = ctx.Process(target=_child, name=f"grlib-rank-{rank}", daemon=False,
                               args=(fn, args, kwargs or {}, child_env, backend, timeout_s, writer, os.getpid()))
            try:
                proc.start()  # pickles fn, args, kwargs to the child over spawn's pipe: an unpicklable one raises here
            finally:
                writer.close()  # the child holds the only writer: EOF on `reader` once it is gone
            procs.append(proc)
        return _watch(procs, conns, timeout_s, grace_s)
    finally:
        _stop(procs)
        for conn in conns.values():
            conn.close()


def _watch(procs: list[Any], conns: dict[int, Connection], timeout_s: float, grace_s: float) -> list[Any]:
    """Collect results until every rank is done, a rank failed (+ grace_s) or timeout_s passed."""
    start = time.monotonic()
    results: dict[int, Any] = {}
    failed: dict[int, str] = {}
    exited: set[int] = set()
    open_conns = dict(conns)
    first_failure: float | None = None
    all_in: float | None = None  # when the last result arrived: its rank may still be closing its runtime
    while len(exited) < len(procs):
        now = time.monotonic()
        limit = start + timeout_s if first_failure is None else min(start + timeout_s, first_failure + grace_s)
        if all_in is not None:
            limit = min(limit, all_in + grace_s)  # every result is in: the stragglers get terminated
        if now >= limit:
            break
        sentinels = {procs[r].sentinel: r for r in range(len(procs)) if r not in exited}
        readers = {c: r for r, c in open_conns.items()}
        ready = wait(list(readers) + list(sentinels), timeout=limit - now)
        # exits first, each after its own pipe (a traceback explains an exit code): a rank that died
        # is named before the peers whose collectives failed because of it in the same wake-up
        for obj in ready:
            if obj in sentinels:
                rank = sentinels[obj]
                conn = open_conns.get(rank)
                while conn is not None and rank in open_conns and conn.poll():
                    _receive(rank, conn, results, failed, open_conns)
                procs[rank].join()
                exited.add(rank)
                code = procs[rank].exitcode
                if rank not in failed and code != 0:
                    failed[rank] = _describe_exit(code)
                elif rank not in failed and rank not in results:
                    failed[rank] = "exited with code 0 without returning a result"
        for obj in ready:
            if obj in readers and readers[obj] in open_conns:
                _receive(readers[obj], obj, results, failed, open_conns)
        if failed and first_failure is None:
            first_failure = time.monotonic()
        if len(results) == len(procs) and all_in is None:
            all_in = time.monotonic()
    running = [r for r in range(len(procs)) if r not in exited]
    if len(results) == len(procs) and not failed:
        return [results[r] for r in range(len(procs))]
    if failed:
        lines = [f"rank {r} {why}" for r, why in failed.items()]
        tail = (f"\nranks {running} were still running {grace_s:g} s after the first failure and were "
                "terminated" if running else "")
        raise RankFailed(f"{len(failed)} of {len(procs)} ranks failed, first rank {next(iter(failed))}:\n"
                         + "\n".join(lines) + tail, failed, running)
    if running:
        raise RankFailed(f"timed out after timeout_s={timeout_s:g} s: ranks {running} still running "
                         f"(terminated); ranks {sorted(results)} finished", {}, running)
    raise AssertionError("unreachable: every rank exited, none failed, a result is missing")


def _receive(rank: int, conn: Connection, results: dict[int, Any], failed: dict[int, str],
             open_conns: dict[int, Connection]) -> None:
    """Read one message of `rank`, or note the end of its pipe."""
    try:
        # plain pickle: tensors by value (see _child). Safe to unpickle: these bytes can only come from
        # the child this launcher spawned (the pipe's write end lives in that child alone, see launch),
        # which pickled its own return value; no file or socket a user can hand over reaches here
        kind, payload = pickle.loads(conn.recv_bytes())
    except EOFError:
        open_conns.pop(rank, None)
        return
    except Exception as exc:  # noqa: BLE001  (a result the parent cannot unpickle)
        open_conns.pop(rank, None)
        failed.setdefault(rank, f"returned a value the parent could not unpickle: {exc!r}")
        return
    if kind == "ok":
        results[rank] = payload
    else:
        failed.setdefault(rank, "raised:\n" + _indent_tail(payload))


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code} without reporting an exception"


def _indent_tail(text: str) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) > _TRACEBACK_LINES:
        lines = [f"... ({len(lines) - _TRACEBACK_LINES} traceback lines left out)"] + lines[-_TRACEBACK_LINES:]
    return "\n".join("    " + line for line in lines)


def _stop(procs: list[Any]) -> None:
    """Terminate the children still alive (SIGTERM, then SIGKILL) and join them all."""
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + _TERM_WAIT_S
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join()


def _child(fn: Callable[..., Any], args: tuple, kwargs: dict, env: dict[str, str], backend: str,
           timeout_s: float, conn: Connection, parent_pid: int) -> None:
    """One rank: set the variables, join the group, run fn, send ("ok", value) or ("error", traceback)."""
    os.environ.update(env)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    try:
        runtime = init_runtime(backend=backend, timeout_s=timeout_s)
        value = fn(runtime, *args, **kwargs)
        runtime.close()  # a normal end: after every rank's last collective (an error skips it: os._exit below)
        # plain pickle, not multiprocessing's: its tensor reduction shares memory that dies with this process
        conn.send_bytes(pickle.dumps(("ok", value)))
    except BaseException:  # noqa: BLE001  (reported to the parent, then this rank exits 1)
        try:
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
            conn.close()
        finally:
            os._exit(1)  # no teardown: a process group whose peer died may block in its destructor
    conn.close()


def _exit_with_parent(parent_pid: int) -> None:
    """Exit this rank when its launcher is gone (killed before it could terminate its children)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)
