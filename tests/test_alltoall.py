"""grlib.distributed.alltoall: flat and hierarchical all-to-all deliver the same rows bitwise; Route replies
equal table[ids] and its gradients the single-process ones in every mode x dedup; the link counters
match byte and message counts computed offline from all ranks' data. Multi-process checks run on gloo
as 1 node x 2, 2 nodes x 1 and 2 nodes x 2 (one launch each, many seeded cases per launch); the
local logic (plans, de-duplication, adjoint) is also driven by hypothesis on one process."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from grlib.distributed import Topology, init_runtime, launch
from grlib.distributed.alltoall import DEDUP, MODES, LinkCounters, Route, _segment_order, _unique_pairs, all_to_all

# the owners sum duplicate requests' float32 gradients in another order than one process's index_add:
# within 1e-6 of the exact sum, relative to the summed magnitudes of a row's contributions (at least 1)
GRAD_TOL = 1e-6
COMBOS = [(m, d) for m, d in itertools.product(MODES, DEDUP) if not (m == "flat" and d == "node")]
LAYOUTS = [(2, 1), (2, 2), (4, 2)]  # (world, nodes)


# --- what the ranks run -------------------------------------------------------------------------

def _ranks_run(rt, a2a_cases: list[dict], route_cases: list[dict]) -> dict:
    r = rt.topology.rank
    a2a = []
    for case in a2a_cases:
        row = {}
        for mode in MODES:
            x = torch.from_numpy(case["xs"][r]).requires_grad_(True)
            c = LinkCounters()
            y, recv = all_to_all(x, case["splits"][r], rt, mode, c)
            (y * y.detach()).sum().backward()  # each row goes back to its sender: x.grad == x
            row[mode] = (y.detach().numpy(), recv, x.grad.numpy(), c.as_dict())
        a2a.append(row)
    routes = []
    for case in route_cases:
        ids = torch.from_numpy(case["ids"][r])
        table = torch.from_numpy(case["table"])
        owner = torch.from_numpy(case["owner_of"])[ids]
        row = {}
        for mode, dedup in COMBOS:
            c = LinkCounters()
            route = Route.build(ids, owner, rt, mode, dedup, c)
            trip_ids = c.as_dict()
            c.reset()
            t = table.clone().requires_grad_(True)
            out = route.reply(t[route.ids])
            trip_rows = c.as_dict()
            c.reset()
            out.backward(torch.from_numpy(case["grads"][r]))
            row[(mode, dedup)] = (out.detach().numpy(), route.ids.numpy(), t.grad.numpy(),
                                  (trip_ids, trip_rows, c.as_dict()))
        routes.append(row)
    return {"a2a": a2a, "routes": routes}


# --- seeded cases (the parent knows every rank's data) ------------------------------------------

def _a2a_cases(P: int, rng: np.random.Generator) -> list[dict]:
    feats = [((), np.float64), ((3,), np.float32), ((2, 3), np.float16)]
    cases = []
    for k in range(8):
        if k == 0:
            splits = np.zeros((P, P), dtype=np.int64)  # nothing at all
        elif k == 1:
            splits = np.zeros((P, P), dtype=np.int64)
            splits[P - 1, 0] = 1  # one row in the whole exchange
        else:
            splits = rng.integers(0, 6, (P, P)) * (rng.random((P, P)) < 0.6)  # zero rows to some ranks
        shape, dtype = feats[k % len(feats)]
        xs = [(rng.standard_normal((int(s.sum()), *shape)) * 100).astype(dtype) for s in splits]
        cases.append({"splits": splits.tolist(), "xs": xs})
    return cases


def _route_cases(P: int, rng: np.random.Generator) -> list[dict]:
    V, F = 40, 4
    cases = []
    for k in range(5):
        sizes = [0, 1] + [int(rng.integers(0, 60)) for _ in range(P - 2)] if k == 0 else \
            [int(rng.integers(1, 80)) for _ in range(P)]
        ids = [(rng.zipf(1.4, n) - 1) % V for n in sizes]
        if k == 1:
            ids = [np.full(n, 7) for n in sizes]  # every request for one id
        owner_of = rng.integers(0, P, V) if k != 2 else np.zeros(V, dtype=np.int64)  # k=2: rank 0 owns all
        cases.append({"ids": [i.astype(np.int64) for i in ids], "owner_of": owner_of.astype(np.int64),
                      "table": rng.standard_normal((V, F)).astype(np.float32),
                      "grads": [rng.standard_normal((n, F)).astype(np.float32) for n in sizes]})
    return cases


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: f"{p[0]}ranks-{p[1]}nodes")
def run(request) -> dict:
    world, nodes = request.param
    rng = np.random.default_rng(world * 10 + nodes)
    a2a, routes = _a2a_cases(world, rng), _route_cases(world, rng)
    results = launch(_ranks_run, world, nodes=nodes, args=(a2a, routes), timeout_s=120)
    return {"P": world, "L": world // nodes, "a2a": a2a, "routes": routes, "results": results}


# --- all_to_all ---------------------------------------------------------------------------------

def test_all_to_all_flat_equals_hierarchical_and_the_offline_exchange(run):
    P, L = run["P"], run["L"]
    for k, case in enumerate(run["a2a"]):
        S = np.asarray(case["splits"])
        for r in range(P):
            got = run["results"][r]["a2a"][k]
            starts = [np.cumsum(S[s]) - S[s] for s in range(P)]
            expected = np.concatenate([case["xs"][s][starts[s][r]:starts[s][r] + S[s, r]] for s in range(P)])
            y_flat, recv_flat, grad_flat, c_flat = got["flat"]
            y_hier, recv_hier, grad_hier, c_hier = got["hierarchical"]
            assert y_flat.dtype == y_hier.dtype == case["xs"][r].dtype
            assert np.array_equal(y_flat, expected) and np.array_equal(y_hier, expected)  # bitwise
            assert recv_flat == recv_hier == S[:, r].tolist()
            assert np.array_equal(grad_flat, case["xs"][r]) and np.array_equal(grad_hier, case["xs"][r])
            row = case["xs"][r].itemsize * int(np.prod(case["xs"][r].shape[1:]))
            same = np.arange(P) // L == r // L
            # forward and backward trips: the flat backward sends back what it received
            assert c_flat["intra_bytes"] == row * int(S[r, same].sum() - S[r, r] + S[same, r].sum() - S[r, r])
            assert c_flat["inter_bytes"] == row * int(S[r, ~same].sum() + S[~same, r].sum())
            n, l, node = r // L, r % L, np.arange(P) // L
            other_local = np.arange(P) % L != l
            mates = S[n * L:(n + 1) * L]  # [L, P]: what my node-mates send
            assert c_hier["intra_bytes"] == row * int(S[r, other_local].sum()  # stage 1, then its reverse
                                                      + mates[np.arange(L) != l][:, l::L].sum())
            assert c_hier["inter_bytes"] == row * int(mates[:, l::L][:, np.arange(P // L) != n].sum()
                                                      + S[node != n, r].sum())
            assert c_flat["intra_messages"] == 2 * (L - 1) and c_flat["inter_messages"] == 2 * (P - L)
            assert c_hier["intra_messages"] == 2 * (L - 1) and c_hier["inter_messages"] == 2 * (P // L - 1)
            assert c_flat["calls"] == c_hier["calls"] == 2
        inter = {m: sum(run["results"][r]["a2a"][k][m][3]["inter_bytes"] for r in range(P)) for m in MODES}
        assert inter["flat"] == inter["hierarchical"]


# --- Route --------------------------------------------------------------------------------------

def _expected_served(case: dict, P: int, L: int, dedup: str, r: int) -> np.ndarray:
    """The ids rank r serves, in Route's documented order."""
    asked = [i[case["owner_of"][i] == r] for i in case["ids"]]  # per source rank, in request order
    if dedup == "none":
        return np.concatenate(asked)
    if dedup == "rank":
        return np.concatenate([np.unique(a) for a in asked])
    return np.concatenate([np.unique(np.concatenate(asked[n * L:(n + 1) * L])) for n in range(P // L)])


def _inter_offline(case: dict, P: int, L: int) -> dict[str, int]:
    """Inter-node id requests of the whole batch: every request, distinct per rank, distinct per node."""
    out = {"none": 0, "rank": 0, "node": 0}
    for n, d in itertools.product(range(P // L), range(P)):
        if d // L == n:
            continue
        asked = [i[case["owner_of"][i] == d] for i in case["ids"][n * L:(n + 1) * L]]
        out["none"] += sum(a.size for a in asked)
        out["rank"] += sum(np.unique(a).size for a in asked)
        out["node"] += np.unique(np.concatenate(asked)).size
    return out


def test_route_replies_table_rows_and_routes_gradients(run):
    P, L = run["P"], run["L"]
    for k, case in enumerate(run["routes"]):
        reference = np.zeros(case["table"].shape)  # float64: d sum(table[ids] * g) / d table, exactly enough
        magnitude = np.zeros(case["table"].shape)
        for r in range(P):
            np.add.at(reference, case["ids"][r], case["grads"][r].astype(np.float64))
            np.add.at(magnitude, case["ids"][r], np.abs(case["grads"][r].astype(np.float64)))
        for combo in COMBOS:
            grads = np.zeros_like(case["table"])
            for r in range(P):
                out, served, grad, _ = run["results"][r]["routes"][k][combo]
                assert np.array_equal(out, case["table"][case["ids"][r]])  # bitwise, N rows in request order
                assert np.array_equal(served, _expected_served(case, P, L, combo[1], r))
                assert not grad[case["owner_of"] != r].any()  # an owner gets gradients for its rows only
                grads += grad
            assert (np.abs(grads - reference) <= GRAD_TOL * np.maximum(magnitude, 1.0)).all()


def test_route_counters_match_offline_counts(run):
    P, L = run["P"], run["L"]
    for k, case in enumerate(run["routes"]):
        F = case["table"].shape[1]
        offline = _inter_offline(case, P, L)
        total = {}
        for combo in COMBOS:
            trips = [run["results"][r]["routes"][k][combo][3] for r in range(P)]
            for ids_trip, rows_trip, grad_trip in trips:
                assert (ids_trip["calls"], rows_trip["calls"], grad_trip["calls"]) == (1, 1, 1)
                for cls in ("intra", "inter"):  # the gradients retrace the ids' path with F floats a row
                    assert grad_trip[f"{cls}_bytes"] == ids_trip[f"{cls}_bytes"] // 8 * 4 * F
                    assert grad_trip[f"{cls}_messages"] == ids_trip[f"{cls}_messages"] == rows_trip[f"{cls}_messages"]
                assert ids_trip["intra_messages"] == L - 1
                assert ids_trip["inter_messages"] == (P - L if combo[0] == "flat" else P // L - 1)
            for cls in ("intra", "inter"):  # the rows retrace the whole exchange in reverse
                sent = sum(t[0][f"{cls}_bytes"] for t in trips)
                assert sum(t[1][f"{cls}_bytes"] for t in trips) == sent // 8 * 4 * F
            total[combo] = sum(t[0]["inter_bytes"] for t in trips)
        assert total[("flat", "none")] == total[("hierarchical", "none")] == 8 * offline["none"]
        assert total[("flat", "rank")] == total[("hierarchical", "rank")] == 8 * offline["rank"]
        factor = offline["node"] / offline["none"] if offline["none"] else 1.0  # de-duplication factor
        assert total[("hierarchical", "node")] == pytest.approx(factor * total[("flat", "none")], abs=1e-6)
        assert total[("hierarchical", "node")] == 8 * offline["node"]


# --- one process: the local logic under hypothesis ----------------------------------------------

@pytest.fixture(scope="module")
def single():
    return init_runtime(Topology.single(), backend="gloo", threads=None)


@given(ids=st.lists(st.integers(0, 30), max_size=40), feat=st.integers(1, 3), combo=st.sampled_from(COMBOS),
       seed=st.integers(0, 2**16))
def test_route_on_one_process(single, ids, feat, combo, seed):
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(rng.standard_normal((31, feat)))
    ids_t = torch.tensor(ids, dtype=torch.int64)
    c = LinkCounters()
    route = Route.build(ids_t, torch.zeros_like(ids_t), single, *combo, counters=c)
    expected = sorted(set(ids)) if combo[1] != "none" else ids
    assert route.ids.tolist() == expected
    t = table.clone().requires_grad_(True)
    out = route.reply(t[route.ids])
    assert torch.equal(out, table[ids_t])
    g = torch.from_numpy(rng.standard_normal((len(ids), feat)))
    out.backward(g)
    reference = torch.zeros_like(table).index_add_(0, ids_t, g)
    torch.testing.assert_close(t.grad, reference, rtol=0, atol=1e-12)
    assert c.intra_bytes == c.inter_bytes == c.intra_messages == c.inter_messages == 0 and c.calls == 3


@given(sizes=st.lists(st.integers(0, 5), max_size=8), data=st.data())
def test_segment_order_lays_segments_out_in_order(sizes, data):
    order = data.draw(st.permutations(range(len(sizes))))
    x = torch.arange(sum(sizes))
    parts = torch.split(x, sizes) if sizes else []
    sel = _segment_order(np.asarray(sizes, dtype=np.int64), np.asarray(order, dtype=np.int64), x.device)
    expected = torch.cat([parts[i] for i in order]) if sizes else x
    assert torch.equal(x[sel.fwd], expected)
    assert torch.equal(x[sel.fwd][sel.back], x)


@given(pairs=st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 5)), max_size=30))
def test_unique_pairs_matches_numpy(pairs):
    key = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    ids = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    sel = _unique_pairs(key, ids)
    assert [(int(key[i]), int(ids[i])) for i in sel.fwd] == sorted(set(pairs))
    assert torch.equal(key[sel.fwd][sel.back], key) and torch.equal(ids[sel.fwd][sel.back], ids)


def test_bad_arguments_are_refused(single):
    ids = torch.tensor([1, 2], dtype=torch.int64)
    owner = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"mode='ring': expected one of \('flat', 'hierarchical'\)"):
        Route.build(ids, owner, single, mode="ring")
    with pytest.raises(ValueError, match=r"dedup='all': expected one of \('none', 'rank', 'node'\)"):
        Route.build(ids, owner, single, dedup="all")
    with pytest.raises(ValueError, match="dedup='node' de-duplicates between the two stages"):
        Route.build(ids, owner, single, mode="flat", dedup="node")
    with pytest.raises(ValueError, match=r"owner holds ranks outside \[0, 1\)"):
        Route.build(ids, owner + 1, single)
    with pytest.raises(ValueError, match="ids must be one-dimensional int64"):
        Route.build(ids.float(), owner, single)
    with pytest.raises(ValueError, match="rows must have 2 rows"):
        Route.build(ids, owner, single).reply(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"splits=\[3\]: expected 1 counts"):
        all_to_all(torch.zeros(2, 4), [3], single)
    with pytest.raises(ValueError, match="mode='x'"):
        all_to_all(torch.zeros(2, 4), [2], single, mode="x")
