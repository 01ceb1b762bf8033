"""Opt-in (GRLIB_NETNS=1, root, iproute2's ip and tc): 2 gloo ranks as 2 nodes x 1, each in its own
network namespace, joined by a veth pair whose rank-0 end is rate-limited with tbf. The beta that
grlib.sim.alltoall.fit_link fits to measure_gloo's times must match the tbf rate within 25%: the
exchange ends when the shaped direction has carried its m bytes.

One end only: with both ends shaped, gloo's all-to-all ran at about half the rate per direction
(1 MiB per peer: 100 Mbit/s through 200 Mbit/s tbf on each end, measured here), while two separate
TCP connections, one each way, each got the full rate. Gloo carries both directions of a pair over
one TCP connection, whose acknowledgements then queue behind the other direction's data in the
other shaped queue (two-way traffic, ack compression) - a property of TCP through deep shaped
queues, not of the model's per-direction link, so the test keeps the reverse path free.

Only the bandwidth part can be shaped here: tbf limits the rate, and netem (which would add a
per-packet delay, the alpha part) is not available in this kernel. Everything the test creates -
two namespaces (the veth pair lives inside them and goes with them) and the two rank processes - is
removed afterwards, in bounded loops; the addresses exist only inside those namespaces.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from grlib.sim.alltoall import fit_link

RATE_MBIT = 200  # tbf rate of the rank-0 end of the veth pair
SIZES = [2**k for k in range(16, 23)]  # bytes per peer, 64 KiB .. 4 MiB
REPEATS = 5
BETA_TOL = 0.25
ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import json, sys
import grlib
from grlib.distributed import init_runtime
from grlib.sim.alltoall import measure_gloo
rt = init_runtime(backend="gloo", timeout_s=60)
rows = measure_gloo(rt, [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), warmup=1)
if rt.topology.rank == 0:
    open(sys.argv[1], "w").write(json.dumps(rows))
rt.close()
"""


def _skip_reason() -> str | None:
    if os.environ.get("GRLIB_NETNS") != "1":
        return "opt-in: set GRLIB_NETNS=1 (creates network namespaces and a veth pair; needs root)"
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs iproute2's {' and '.join(missing)}"
    return None


def _run(*cmd: str) -> None:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=20).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@contextmanager
def veth_pair(rate_mbit: int, shaped: tuple[int, ...] = (0,)) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(namespaces, interfaces, addresses) of two namespaces joined by a veth pair; the ends in
    `shaped` (0, 1) send at most rate_mbit (tbf on their egress)."""
    tag = os.getpid()
    ns = [f"grlib-a2a-{tag}-{r}" for r in (0, 1)]
    ifs = [f"ga2a{tag % 100000}{'ab'[r]}" for r in (0, 1)]
    subnet = f"10.213.{tag % 250}"
    addrs = [f"{subnet}.1", f"{subnet}.2"]
    clash = set(ns) & _namespaces()
    if clash:
        raise RuntimeError(f"namespaces {sorted(clash)} already exist: remove them (ip netns del) and rerun")
    created: list[str] = []
    try:
        for name in ns:
            _run("ip", "netns", "add", name)
            created.append(name)
        _run("ip", "-n", ns[0], "link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1], "netns", ns[1])
        for end, (name, dev, addr) in enumerate(zip(ns, ifs, addrs)):
            _run("ip", "-n", name, "addr", "add", f"{addr}/30", "dev", dev)
            _run("ip", "-n", name, "link", "set", dev, "up")
            _run("ip", "-n", name, "link", "set", "lo", "up")
            if end in shaped:
                _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                     "rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "20ms")
        yield ns, ifs, addrs
    finally:
        for _ in range(5):  # deleting a namespace removes the veth end inside it, and so the pair
            for name in set(created) & _namespaces():
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
            if not set(created) & _namespaces():
                break
            time.sleep(0.5)  # a pause before the next try at removing them (no duration is asserted)
        left = set(created) & _namespaces()
        if left:
            raise RuntimeError(f"could not remove namespaces {sorted(left)}: remove them with ip netns del")


def test_tbf_rate_is_the_fitted_bandwidth(tmp_path: Path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "rows.json"
    with veth_pair(RATE_MBIT) as (ns, ifs, addrs):
        procs = []
        try:
            for rank in (0, 1):
                env = {**os.environ, "MASTER_ADDR": addrs[0], "MASTER_PORT": "29500", "RANK": str(rank),
                       "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "GLOO_SOCKET_IFNAME": ifs[rank], "OMP_NUM_THREADS": "1"}
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", ns[rank], sys.executable, "-c", WORKER, str(out),
                     ",".join(map(str, SIZES)), str(REPEATS)],
                    env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            logs = [p.communicate(timeout=240)[0] for p in procs]
        finally:
            for p in procs:  # ip netns exec execs the worker: the Popen is the rank itself
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=20)
        assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-2000:] for log in logs)
    rows = json.loads(out.read_text())
    m = np.array([r["bytes_per_peer"] for r in rows], dtype=np.float64)
    t = np.array([r["seconds"] for r in rows])
    link = fit_link(m, t)
    expected = 8 / (RATE_MBIT * 1e6)  # seconds per byte of the tbf rate
    residual = (link.alpha_s + link.beta_s_per_byte * m) / t - 1
    print(f"\nnetns + tbf {RATE_MBIT} Mbit/s: alpha {link.alpha_s * 1e6:.1f} us, beta "
          f"{link.beta_s_per_byte * 1e9:.3f} ns/B ({8e-6 / link.beta_s_per_byte:.1f} Mbit/s fitted); "
          f"beta / tbf's {link.beta_s_per_byte / expected:.3f}; fit residuals {np.round(residual, 3).tolist()}")
    for r in rows:
        print(f"  {r['bytes_per_peer']:>8} B/peer  {r['seconds'] * 1e3:9.3f} ms  "
              f"({r['bytes_per_peer'] * 8 / r['seconds'] / 1e6:.1f} Mbit/s)")
    assert abs(link.beta_s_per_byte / expected - 1) <= BETA_TOL
