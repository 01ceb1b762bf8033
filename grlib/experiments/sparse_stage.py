"""Stage `sparse` (notebooks/05_sparse_parallelism, `bench a2a`): claim C3, hierarchical sparse
parallelism (paper: all-to-all latency -75.9%).

The item table is sharded row-wise over ranks (grlib.distributed.sharded_embedding.ShardedRows) and every
lookup is an all-to-all, flat or two-stage (grlib.distributed.alltoall). Five parts, each a `part` of table
`sparse`, with `obtained` measured | modelled | computed:

    gloo      measured: all_to_all_single on 2 gloo processes (and 4 as 2 nodes x 2) at 64 KiB .. 4 MiB
              per peer; alpha + beta * m fitted per message (grlib.sim.alltoall.fit_link); per size the
              median, the model's prediction and its error, with the 1-minute load (the cores are shared)
    counters  measured: 4 ranks as 2 nodes x 2 look up their shares of one training batch of the scale's
              data in a ShardedRows table (n_items x d_model): flat, flat + rank de-duplication,
              hierarchical, hierarchical + node de-duplication; bytes and messages per link class and
              rank (LinkCounters: ids out and rows back), the inter-node bytes the ids imply, rows == table[ids]
    model     modelled: grlib.sim.alltoall.table for each preset and rank count at the paper's shape
              (`paper_shape`), with de-duplication factors from the twin's item ids (`id_dedup`) and from
              iid draws of its Zipf law over KuaiRand-27K's catalogue (`zipf_distinct`); cut_regime
    memory    measured: bytes of the shard each rank holds at 1, 2, 4 ranks; computed: the paper's table
              (KuaiRand-27K's videos x d_model, fp32 weights + 2 Adam moments) at memory_ranks ranks
    torchrec  measured: the same ids on 2 ranks through TorchRec's row-wise table and grlib's flat one
              (rows equal, median lookup seconds), or one `skipped` row saying why

The processes of the measured parts are launched once per world size (2, and 4 as 2 x 2) and run
their parts in turn (grlib.experiments.sparse_measured, which also makes their rows). C3's verdicts
(`acceptance`): the modelled change at 64 / 512 / 1536 ranks of the gpu-8 preset vs the paper's
-75.9% (same ids; and node vs rank de-duplication), the gloo fit within the registry's tolerance,
hierarchical inter-node bytes equal to flat's; the measured node / rank de-duplication factor beside
them.
"""
from __future__ import annotations

import dataclasses
import math

import altair as alt
import numpy as np
import polars as pl
import torch

from grlib import plots, results
from grlib.config import Config, SparseAblation, choices, load_config
from grlib.data import registry as datasets
from grlib.data.catalog import load_dataset
from grlib.data.sequences import SequenceData
from grlib.data.synthetic import ZIPF_EXPONENT
from grlib.distributed.launch import launch
from grlib.distributed.topology import Runtime, Topology
from grlib.experiments import claims as registry
from grlib.experiments import sparse_measured as measured
from grlib.experiments.measure import kuairand_lengths
from grlib.experiments.sparse_measured import FP32, LOOKUP_WORLD
from grlib.sim.alltoall import PRESETS, cut_regime, flat_time, two_stage_time
from grlib.sim.alltoall import table as model_table

TABLE = "sparse"
PARTS = choices.SPARSE_PARTS
PRESET, ACCEPT_RANKS = "gpu-8", (64, 512, 1536)  # C3's acceptance cells
KUAIRAND = datasets.get("kuairand-27k")  # its published video count sizes the paper's table


def quick(ab: SparseAblation) -> SparseAblation:
    """A grid for the smoke scale and the notebook's default: two launches, every part but torchrec."""
    return dataclasses.replace(ab, gloo_ranks=[2], gloo_sizes=[2**16, 2**18, 2**20], gloo_repeats=5, lookup_users=8,
                               lookup_repeats=2, dedup_batches=1, torchrec=False)


def check(ab: SparseAblation, parts: tuple[str, ...] = PARTS) -> None:
    """Refuse unknown parts, presets, and rank counts that are not whole nodes of every preset."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown parts {unknown}; valid: {PARTS}")
    for name in ab.presets:
        if name not in PRESETS:
            raise ValueError(f"ablations.sparse.presets: unknown preset {name!r}; valid: {', '.join(PRESETS)}")
        L = PRESETS[name].devices_per_node
        bad = [r for r in ab.ranks if r % L]
        if bad:
            raise ValueError(f"ablations.sparse.ranks: {bad} are not whole nodes of {name} ({L} devices per node)")


# --- the paper's shape and de-duplication factors -----------------------------------------------

def paper_shape(ab: SparseAblation) -> dict:
    """Tokens and bytes each rank exchanges at the paper preset: users_per_rank users of KuaiRand-27K
    lengths (lognormal fit, 27,285 users) cut at its max_len, d_model fp32 values per token."""
    paper = load_config("paper")
    pool = kuairand_lengths(KUAIRAND.users, paper.data.max_len, "truncated", seed=0)  # [users]
    tokens = ab.users_per_rank * float(pool.mean())
    return {"users_per_rank": ab.users_per_rank, "max_len": paper.data.max_len, "d_model": paper.model.d_model,
            "tokens_per_rank": tokens, "bytes_per_rank": tokens * paper.model.d_model * FP32}


def id_dedup(data: SequenceData, max_len: int, local_world: int, users_per_rank: int, batches: int,
             seed: int = 0) -> dict:
    """Distinct fractions of one node's ids: (rank, id) pairs / ids and (node, id) pairs / ids, the node
    being `local_world` ranks of users_per_rank users each (fewer where the data has fewer users), mean
    over `batches` training batches."""
    U = min(users_per_rank, data.n_users // local_world)
    if U < 1:
        raise ValueError(f"the data has {data.n_users} users: too few for {local_world} ranks per node")
    f_rank, f_node, tokens = [], [], []
    for _, batch in zip(range(batches), data.train_batches(local_world * U, max_len, np.random.default_rng(seed))):
        ids, off = batch.item_ids.numpy(), batch.offsets.numpy()  # [T], [B + 1]
        if off.size - 1 < local_world * U:  # the last, short batch
            break
        f_rank.append(sum(np.unique(ids[off[r * U]:off[(r + 1) * U]]).size for r in range(local_world)) / ids.size)
        f_node.append(np.unique(ids).size / ids.size)
        tokens.append(ids.size / local_world)
    return {"dedup_rank": float(np.mean(f_rank)), "dedup": float(np.mean(f_node)), "ids_users_per_rank": U,
            "ids_tokens_per_rank": float(np.mean(tokens)), "ids_batches": len(f_node), "ids_n_items": data.n_items}


def zipf_distinct(n_items: int, draws: list[float], exponent: float = ZIPF_EXPONENT,
                  chunk: int = 1 << 22) -> list[float]:
    """Expected distinct fraction of n iid draws of a Zipf law (p_i ~ i^-exponent, i = 1..n_items), for
    each n of `draws`: sum_i (1 - (1 - p_i)^n) / n."""
    starts = range(1, n_items + 1, chunk)
    ranks = lambda a: np.arange(a, min(a + chunk, n_items + 1), dtype=np.float64)  # noqa: E731
    norm = sum(float(np.power(ranks(a), -exponent).sum()) for a in starts)
    found = np.zeros(len(draws))
    for a in starts:
        with np.errstate(divide="ignore"):  # one item: p = 1, log(0) = -inf, and it is drawn for sure
            log_miss = np.log1p(-np.power(ranks(a), -exponent) / norm)  # [chunk] log(1 - p_i)
        found += [float(-np.expm1(n * log_miss).sum()) for n in draws]
    return [float(f / n) for f, n in zip(found, draws)]


# --- parts --------------------------------------------------------------------------------------

def model(cfg: Config, ab: SparseAblation, data: SequenceData, seed: int = 0) -> list[dict]:
    """Modelled: every preset x ranks at the paper's shape, for each source of de-duplication factors."""
    shape = paper_shape(ab)
    target = -registry.target("C3.all_to_all").paper.number  # the paper's cut, 0.759
    tokens = shape["tokens_per_rank"]
    rows = []
    for name in ab.presets:
        c = PRESETS[name]
        L = c.devices_per_node
        twin = id_dedup(data, cfg.data.max_len, L, ab.users_per_rank, ab.dedup_batches, seed)
        z_rank, z_node = zipf_distinct(KUAIRAND.items, [tokens, L * tokens])
        sources = {
            "twin": (twin, f"the twin's item ids ({cfg.scale} data, {data.n_items} items, Zipf {ZIPF_EXPONENT:g}), "
                           f"{L} ranks x {twin['ids_users_per_rank']} users per node"),
            "zipf-kuairand": ({"dedup_rank": z_rank, "dedup": z_node},
                              f"iid draws of the twin's Zipf {ZIPF_EXPONENT:g} law over KuaiRand-27K's "
                              f"{KUAIRAND.items:,} videos at the paper's tokens per rank")}
        for source, (f, how) in sources.items():
            fr, fn = f["dedup_rank"], f["dedup"]
            for P in ab.ranks:
                m = shape["bytes_per_rank"] / P
                row = model_table(c, [P], m, fn)[0]
                flat_rd, two_nd = flat_time(c, P, m * fr), two_stage_time(c, P, m * fr, fn / fr)
                plain, dedup = cut_regime(c, P, target), cut_regime(c, P, target, fn)
                rows.append({"part": "model", "obtained": "modelled", **row, **shape, **f, "dedup_source": source,
                             "dedup_how": how, "dedup_node_over_rank": fn / fr, "flat_rank_dedup_s": flat_rd,
                             "two_stage_node_dedup_s": two_nd, "cut_node_vs_rank": 1 - two_nd / flat_rd,
                             "target_cut": target, "regime_low": _edge(plain, 0), "regime_high": _edge(plain, 1),
                             "regime_dedup_low": _edge(dedup, 0), "regime_dedup_high": _edge(dedup, 1)})
    return rows


def _edge(regime: tuple[float, float] | None, i: int) -> float:
    return math.nan if regime is None else regime[i]


def measure(cfg: Config, ab: SparseAblation, parts: tuple[str, ...] = PARTS, seed: int = 0) -> list[dict]:
    """The rows of `parts`; the measured ones from one launch per world size (2, and 4 as 2 x 2)."""
    check(ab, parts)
    data = load_dataset(cfg, "scale").data if set(parts) - {"gloo"} else None
    d, V = cfg.model.d_model, data.n_items if data is not None else 0
    tasks: dict[int, dict] = {2: {}, LOOKUP_WORLD: {}}
    for P in ab.gloo_ranks if "gloo" in parts else []:
        tasks[P]["gloo"] = (list(ab.gloo_sizes), ab.gloo_repeats)
    if "memory" in parts:
        tasks[2]["memory"] = tasks[LOOKUP_WORLD]["memory"] = (V, d, seed)
    ids = (measured.lookup_ids(data, cfg.data.max_len, LOOKUP_WORLD, ab.lookup_users, seed)
           if {"counters", "torchrec"} & set(parts) else [])
    lookup = {"n_items": V, "d": d, "seed": seed, "repeats": ab.lookup_repeats}
    if "counters" in parts:
        tasks[LOOKUP_WORLD]["counters"] = {"ids": ids, **lookup}
    why = ("ablations.sparse.torchrec is false (the quick grid leaves TorchRec out)" if not ab.torchrec else
           f"d_model={d}: TorchRec's CPU kernel needs a multiple of 4" if d % 4 else "")
    if "torchrec" in parts and not why:
        tasks[2]["torchrec"] = {"ids": [np.concatenate(ids[:2]), np.concatenate(ids[2:])], **lookup}
    out = {P: launch(measured.rank_program, P, nodes=P // 2, args=(t,), timeout_s=900) for P, t in tasks.items() if t}
    rows = []
    if "gloo" in parts:
        rows += measured.gloo_rows({P: o[0]["gloo"] for P, o in out.items() if "gloo" in o[0]})
    if "counters" in parts:
        rows += measured.counters_rows([r["counters"] for r in out[LOOKUP_WORLD]], ids, V, d)
    if "model" in parts:
        rows += model(cfg, ab, data, seed)
    if "memory" in parts:
        one = measured.rank_program(Runtime(Topology.single(), "gloo", torch.device("cpu")), {"memory": (V, d, seed)})
        shards = {1: [one["memory"]], **{P: [r["memory"] for r in o] for P, o in out.items()}}
        rows += measured.memory_rows(shards, V, d, KUAIRAND.items, load_config("paper").model.d_model, ab.memory_ranks)
    if "torchrec" in parts:
        rows += measured.torchrec_rows([r["torchrec"] for r in out[2]] if not why else None, why, V, d)
    return rows


def run(cfg: Config, ab: SparseAblation) -> dict:
    """Every part; rows appended to table `sparse`; the chart and the metrics JSON written."""
    table = results.append_rows(TABLE, measure(cfg, ab), cfg)
    checks = acceptance(table)
    gloo = table.filter(pl.col("part") == "gloo")
    fits = {str(P): {"alpha_s": g["alpha_s"][0], "beta_s_per_byte": g["beta_s_per_byte"][0],
                     "max_abs_error": float(g["error"].abs().max()),
                     "load": float(max(g["load_before"].max(), g["load_after"].max()))}
            for (P,), g in gloo.group_by("ranks")}
    results.write_metrics(TABLE, {"scale": cfg.scale, "paper_shape": paper_shape(ab), "gloo_fit": fits,
                                  "acceptance": checks.to_dicts()}, cfg.scale)
    figures = plots.save_chart(chart(table), "sparse_a2a", cfg.scale)
    return {"table": table, "acceptance": checks, "figures": figures}


# --- verdicts, chart, views ---------------------------------------------------------------------

def _size(b: float) -> str:
    return f"{b / 2**20:.3g} MiB" if b >= 2**20 else f"{b / 2**10:.3g} KiB"


def _part(table: pl.DataFrame, part: str) -> pl.DataFrame:
    return table.filter(pl.col("part") == part) if "part" in table.columns else table.clear()


def _one(df: pl.DataFrame, **cell) -> dict | None:
    if df.height == 0:
        return None
    for k, v in cell.items():
        df = df.filter(pl.col(k) == v)
    return df.row(0, named=True) if df.height else None


def acceptance(table: pl.DataFrame) -> pl.DataFrame:
    """C3's checks on one run's rows: target, check, value (a fraction; a change is negative), met."""
    out = []
    t = registry.target("C3.all_to_all")
    model = _part(table, "model")
    for P in ACCEPT_RANKS:
        twin = _one(model, cluster=PRESET, ranks=P, dedup_source="twin")
        if twin is None:
            continue
        zipf = _one(model, cluster=PRESET, ranks=P, dedup_source="zipf-kuairand")
        cell = (f"{PRESET}, {P} ranks = {twin['nodes']} nodes x {twin['devices_per_node']}, "
                f"{_size(twin['bytes_per_peer'])} per peer")
        z = (f"; with iid Zipf ids over KuaiRand-27K's videos (distinct {zipf['dedup_rank']:.2f} per rank, "
             f"{zipf['dedup']:.2f} per node): {-zipf['cut_node_vs_rank']:+.1%}" if zipf else "")
        twin_ids = f"twin ids: distinct {twin['dedup_rank']:.2f} per rank, {twin['dedup']:.2f} per node"
        for value, what in ((-twin["cut"], "two-stage vs flat, the same ids (no de-duplication)"),
                            (-twin["cut_node_vs_rank"], "two-stage + node de-duplication vs flat + rank "
                             f"de-duplication ({twin_ids}){z}")):
            out.append({"target": t.key, "check": f"{cell}: {what}", "value": value, "met": t.met(value)})
    gloo, tg = _part(table, "gloo"), registry.target("C3.gloo_fit")
    for P in sorted(gloo["ranks"].unique()) if gloo.height else []:
        g = gloo.filter(pl.col("ranks") == P)
        r, err = g.row(0, named=True), float(g["error"].abs().max())
        load = max(float(g["load_before"].max()), float(g["load_after"].max()))
        text = (f"{P} gloo ranks ({r['nodes']} node(s)), {g.height} sizes {_size(g['bytes_per_peer'].min())} .. "
                f"{_size(g['bytes_per_peer'].max())} per peer: alpha {1e6 * r['alpha_s']:.1f} us + "
                f"{1e-9 / max(r['beta_s_per_byte'], 1e-30):.2f} GB/s per message; 1-minute load {load:.1f} on "
                f"{r['cpus']} CPUs")
        if "error_from_2" in g.columns and g["error_from_2"].is_not_null().all():
            text += f"; the 2-rank fit misses these by up to {float(g['error_from_2'].abs().max()):.0%}"
        out.append({"target": tg.key, "check": text, "value": err, "met": tg.met(err)})
    out += _counter_checks(_part(table, "counters"))
    return pl.DataFrame(out, schema={"target": pl.String, "check": pl.String, "value": pl.Float64, "met": pl.Boolean})


def _counter_checks(counters: pl.DataFrame) -> list[dict]:
    """C3.inter_bytes (hierarchical vs flat, rank de-duplication) and C3.dedup (node / rank) from the
    counters' inter-node bytes summed over ranks per variant."""
    if counters.height == 0:
        return []
    sums = counters.group_by("mode", "dedup_by").agg(pl.col("inter_bytes").sum(), pl.col("ids").sum(),
                                                     pl.col("inter_bytes_expected_total").first())
    totals = {(r["mode"], r["dedup_by"]): r for r in sums.iter_rows(named=True)}
    flat, hier = totals[("flat", "rank")]["inter_bytes"], totals[("hierarchical", "rank")]["inter_bytes"]
    none, node = totals[("flat", "none")]["inter_bytes"], totals[("hierarchical", "node")]
    diff = 0.0 if hier == flat else abs(hier - flat) / flat if flat else math.nan
    as_ids = all(r["inter_bytes"] == r["inter_bytes_expected_total"] for r in totals.values())
    implied = node["inter_bytes_expected_total"] / totals[("hierarchical", "rank")]["inter_bytes_expected_total"]
    r0 = counters.row(0, named=True)
    cell = (f"{r0['nodes']} nodes x {r0['ranks'] // r0['nodes']} ranks, {totals[('flat', 'none')]['ids']} ids of a "
            "training batch")
    yes = lambda ok: "yes" if ok else "NO"  # noqa: E731
    t, td = registry.target("C3.inter_bytes"), registry.target("C3.dedup")
    return [{"target": t.key, "value": diff, "met": t.met(diff),
             "check": f"{cell}, rank de-duplication: inter-node bytes hierarchical {hier:,} vs flat {flat:,}; every "
                      f"variant's count equals the ids' {yes(as_ids)}; rows equal table[ids] "
                      f"{yes(counters['rows_equal'].all())}"},
            {"target": td.key, "value": node["inter_bytes"] / hier if hier else math.nan, "met": None,
             "check": f"{cell}, hierarchical: node / rank de-duplication inter-node bytes (the ids imply "
                      f"{implied:.3f}); rank de-duplication / none {flat / none if none else math.nan:.3f}"}]


LATENCY = {"flat": "flat_s", "flat + rank dedup": "flat_rank_dedup_s", "two-stage": "two_stage_s",
           "two-stage + node dedup": "two_stage_node_dedup_s"}
SOURCES = {"twin": "twin ids", "zipf-kuairand": "iid Zipf ids, KuaiRand-27K's videos"}


def chart(table: pl.DataFrame) -> alt.HConcatChart:
    """Modelled latency vs ranks per preset (de-duplication of the twin's ids), and the cut vs flat
    (same ids; node vs rank de-duplication for each id source) with the paper's 75.9% as a gray rule."""
    model = _part(table, "model")
    twin = model.filter(pl.col("dedup_source") == "twin")
    lat = pl.concat([twin.select("cluster", "ranks", (1e3 * pl.col(col)).alias("ms"), pl.lit(name).alias("exchange"))
                     for name, col in LATENCY.items()])
    cuts = pl.concat([twin.select("cluster", "ranks", "cut", pl.lit("two-stage vs flat, same ids").alias("comparison")),
                      model.select("cluster", "ranks", pl.col("cut_node_vs_rank").alias("cut"),
                                   ("node vs rank dedup, " + pl.col("dedup_source").replace_strict(SOURCES))
                                   .alias("comparison"))])
    x = alt.X("ranks:Q", scale=alt.Scale(type="log", domain=[model["ranks"].min(), model["ranks"].max()], nice=False))
    legend = alt.Legend(labelLimit=320, orient="bottom", direction="vertical")
    left = (alt.Chart(lat).mark_line(point=True).encode(
        x=x, y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title="modelled all-to-all per rank (ms)"),
        color=alt.Color("exchange:N", legend=legend),
        tooltip=["cluster", "ranks", "exchange", alt.Tooltip("ms:Q", format=".3f")])
        .properties(width=280, height=170).facet(row=alt.Row("cluster:N", title=None)))
    line = alt.Chart().mark_line(point=True).encode(
        x=x, y=alt.Y("cut:Q", axis=alt.Axis(format="%"), title="latency cut vs flat"),
        color=alt.Color("comparison:N", legend=legend),
        tooltip=["cluster", "ranks", "comparison", alt.Tooltip("cut:Q", format=".1%")])
    paper = -registry.target("C3.all_to_all").paper.number
    rule = alt.Chart().mark_rule(color="gray", strokeDash=[4, 4]).encode(y=alt.datum(paper))
    right = (alt.layer(line, rule, data=cuts).properties(width=280, height=170)
             .facet(row=alt.Row("cluster:N", title=None)))
    return (alt.hconcat(left, right).resolve_scale(color="independent").properties(title=alt.TitleParams(
        "C3: flat vs two-stage all-to-all, alpha-beta model at the paper's shape",
        subtitle=[f"gray rule: the paper's cut {paper:.1%}; latency: de-duplication of the twin's ids"])))


VIEWS = {
    "gloo": ["ranks", "nodes", "bytes_per_peer", "seconds", "p10_s", "p90_s", "predicted_s", "error",
             "predicted_from_2_s", "error_from_2", "alpha_s", "beta_s_per_byte", "load_before", "load_after", "cpus"],
    "counters": ["rank", "mode", "dedup_by", "ids", "distinct_ids", "intra_bytes", "inter_bytes", "intra_messages",
                 "inter_messages", "meta_bytes", "inter_bytes_total", "inter_bytes_expected_total", "rows_equal",
                 "lookup_s"],
    "model": ["cluster", "dedup_source", "ranks", "nodes", "bytes_per_peer", "dedup_rank", "dedup", "flat_s",
              "two_stage_s", "flat_rank_dedup_s", "two_stage_node_dedup_s", "cut", "cut_dedup", "cut_node_vs_rank",
              "regime_low", "regime_high", "regime_dedup_low", "regime_dedup_high"],
    "memory": ["obtained", "ranks", "n_items", "d_model", "shard_bytes", "shard_bytes_total", "even_bytes",
               "block_bytes", "with_adam_bytes"],
    "torchrec": ["obtained", "skipped", "ranks", "ids", "rows_equal", "rows_equal_table", "same_shard", "torchrec_s",
                 "grlib_s"],
}


def _shown(column: str) -> pl.Expr:
    """Seconds as milliseconds (`seconds` -> `ms`, `x_s` -> `x_ms`), seconds per byte as GB/s."""
    if column.endswith("beta_s_per_byte"):
        return (1e-9 / pl.col(column)).alias(column.replace("beta_s_per_byte", "GB_per_s"))
    if column == "seconds" or column.endswith("_s"):
        return (1e3 * pl.col(column)).alias("ms" if column == "seconds" else column[:-2] + "_ms")
    return pl.col(column)


def view(table: pl.DataFrame, part: str) -> pl.DataFrame:
    """The rows of one part with its own columns (those present: a skipped part has fewer); times in
    milliseconds, link speeds in GB/s (the table keeps seconds)."""
    if part not in VIEWS:
        raise ValueError(f"part must be one of {tuple(VIEWS)}, got {part!r}")
    return _part(table, part).select([_shown(c) for c in VIEWS[part] if c in table.columns])
