"""The paper's claims as data: what TurboGR reports, the threshold of each verdict, and where ours comes from.

    Claim    C1..C7 of the paper, and W1 (the workbench's own model-quality target)
      └ Target   one figure of a claim ("C1.speedup"): the paper's number with its unit, the
                 bounds the verdict checks, the result table and the function that compute ours,
                 and how ours is obtained (measured | modelled, with its parameters | not measured yet)

    key          paper            threshold (all bounds hold = met)                       obtained
    C1.speedup   2.2x             speedup vs reference >= 2.2x                            measured (kernels)
    C2.after     2.4%             imbalance <= 2.4%                                       modelled (balance)
    C3.all_to_all -75.9%          latency change <= -75.9%                                modelled (sparse)
    C5.utilisation 94%            utilisation >= 94% (counts when C5.validation holds)    modelled (scaling)
    C6.half      (in words)       memory vs fp32 <= 55%, NDCG@10 change < 1%              measured (negatives)
    C7.mfu       54.71%           MFU >= 54.71%, in bf16 where the CPU has bf16 units     measured (bench_train)

The checks read their thresholds from here when they run (`target(key)`), never from a copy:
kernels_stage.acceptance (C1), balance_stage.acceptance (C2), sparse_stage.acceptance (C3),
negatives_stage.acceptance (C6), scaling.stage.acceptance (C5, C7 scaling), and the report (C7 MFU, W1).
A percentage is written as the paper writes it (70 %) and compared as a fraction (0.70).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Literal

Unit = Literal["x", "%", "ratio"]  # x: times (a speedup or a multiple); %: percent; ratio: a bare number
Op = Literal[">=", "<=", ">", "<"]
Obtained = Literal["measured", "modelled", "not measured yet"]
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclass(frozen=True)
class Figure:
    """A number with its unit as written (70 %, 2.2 x, 0.97)."""
    value: float
    unit: Unit

    @property
    def number(self) -> float:
        """The value to compute with: a percentage as a fraction (70 % -> 0.70)."""
        return self.value / 100 if self.unit == "%" else self.value

    @classmethod
    def of(cls, number: float, unit: Unit) -> Figure:
        """The figure of a computed number (0.973 in unit % -> 97.3 %)."""
        return cls(number * 100 if unit == "%" else number, unit)

    def short(self) -> str:
        """Three significant digits: 116x, 97.3%, 0.97."""
        return f"{self.value:.3g}{'' if self.unit == 'ratio' else self.unit}"

    def __str__(self) -> str:
        return f"{self.value:g}{'' if self.unit == 'ratio' else self.unit}"


@dataclass(frozen=True)
class Bound:
    """One inequality of a verdict: `name op limit`, e.g. speedup vs reference >= 2.2x."""
    name: str
    op: Op
    limit: Figure

    def holds(self, number: float) -> bool:
        """Whether a computed number (a fraction for a % limit) satisfies the bound; NaN never does."""
        return bool(_OPS[self.op](number, self.limit.number))

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.limit}"


@dataclass(frozen=True)
class Method:
    """How our figure is obtained. measured: what is timed or counted; modelled: the model and its
    parameters; not measured yet: what the workbench lacks to measure it."""
    kind: Obtained
    how: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.how}"


@dataclass(frozen=True)
class Claim:
    id: str      # C1..C7, W1
    title: str


@dataclass(frozen=True)
class Target:
    """One figure of a claim and its verdict."""
    key: str                      # "<claim id>.<name>"
    what: str                     # the quantity, in words
    paper: Figure | str | None    # the paper's figure; str: the paper states it in words; None: workbench target
    bounds: tuple[Bound, ...]     # met when every bound holds; () = no verdict (a figure to report)
    table: str | None             # the result table ours is read from (None: no table yet)
    check: str | None             # the function that computes ours or its verdict (module.function)
    method: Method

    @property
    def claim(self) -> str:
        return self.key.split(".")[0]

    @property
    def unit(self) -> Unit:
        """The unit ours is shown in: that of the first bound, else of the paper's figure."""
        if self.bounds:
            return self.bounds[0].limit.unit
        return self.paper.unit if isinstance(self.paper, Figure) else "ratio"

    @property
    def threshold(self) -> str:
        return ", ".join(str(b) for b in self.bounds) or "(no verdict)"

    @property
    def paper_text(self) -> str:
        return "(workbench target)" if self.paper is None else str(self.paper)

    def bound(self, name: str) -> Bound:
        for b in self.bounds:
            if b.name == name:
                return b
        raise KeyError(f"{self.key}: no bound {name!r}; bounds: {[b.name for b in self.bounds]}")

    def met(self, number: float) -> bool:
        """The verdict of a one-bound target on a computed number."""
        if len(self.bounds) != 1:
            raise ValueError(f"{self.key}: has {len(self.bounds)} bounds; check each with .bound(name)")
        return self.bounds[0].holds(number)


def index(items: tuple, key: str) -> dict:
    """`items` by their attribute `key`; a key given twice is an error (a claim is registered once)."""
    out: dict = {}
    for item in items:
        k = getattr(item, key)
        if k in out:
            raise ValueError(f"claims registry: {key} {k!r} registered twice")
        out[k] = item
    return out


def _pct(v: float) -> Figure:
    return Figure(v, "%")


def _x(v: float) -> Figure:
    return Figure(v, "x")


ONE_PROCESS = "the workbench runs one process (no ranks, no all-to-all)"
A2A_MODEL = ("alpha-beta model of one all-to-all per rank, messages in turn (grlib.sim.alltoall), gpu-8 preset: "
             "8 GPUs per node, NVLink 450 GB/s and NIC 50 GB/s per GPU (NVIDIA datasheets), NCCL's per-message "
             "latencies 3.4 / 14 us; the paper's shape: 32 users of KuaiRand-27K lengths cut at 4096 tokens x d 1536 "
             "fp32 per rank, spread evenly over the peers; de-duplication factors from the twin's item ids "
             "(every parameter in the sparse table)")
PIPELINE_MODEL = ("discrete-event model of each rank's steps per schedule (grlib.sim.pipeline): compute = the "
                  "paper preset's FLOPs (KuaiRand-27K lengths, 32 users per rank) at an H100's bf16 dense peak times "
                  "the efficiency one fused layer measured here, comm = the gpu-8 preset's alpha-beta links (ring "
                  "all-reduce, flat or two-stage all-to-alls), balance on the batch's FLOPs; weak-scaling linearity = "
                  "tokens/s per rank at P over 1 rank; counts only when the 2-rank validation holds (C5.validation)")
SIMULATED = ("simulated global batches of KuaiRand-27K lengths (lognormal fit) on the cost model c0 + a*s + b*s^2 "
             "fitted to one HSTU layer measured here (parameters in the balance table); the noisy figure beside it "
             "applies the fit's measured residuals")

CLAIMS: dict[str, Claim] = index((
    Claim("C1", "fused jagged operators remove padding"),
    Claim("C2", "dynamic load balancing across devices"),
    Claim("C3", "hierarchical sparse parallelism"),
    Claim("C4", "semi-asynchronous training"),
    Claim("C5", "fine-grained pipeline orchestration"),
    Claim("C6", "negative sampling (async offload, FP16, logit sharing)"),
    Claim("C7", "end to end: MFU and scaling"),
    Claim("W1", "model quality (workbench target)"),
), "id")

TARGETS: dict[str, Target] = index((
    Target("C1.speedup", "fwd+bwd latency, jagged vs padded attention", _x(2.2),
           (Bound("speedup vs reference", ">=", _x(2.2)),), "kernels", "grlib.experiments.kernels_stage.acceptance",
           Method("measured", "median fwd+bwd time of the compiled cpu kernel and the padded reference on the "
                              "same batch (scaled lengths, max_len 1024)")),
    Target("C1.memory", "peak memory, jagged vs padded attention", _pct(70),
           (Bound("peak-memory reduction vs reference", ">=", _pct(70)),), "kernels",
           "grlib.experiments.kernels_stage.acceptance",
           Method("measured", "peak memory of fwd+bwd, same batch as C1.speedup")),
    Target("C1.vs_fbgemm", "fwd+bwd latency, compiled cpu kernel vs fbgemm's jagged attention", None,
           (Bound("fbgemm time / cpu time", ">", _x(1)),), "kernels", "grlib.experiments.kernels_stage.acceptance",
           Method("measured", "median fwd+bwd time, every regime and max_len of the kernels grid")),
    Target("C2.before", "per-rank load imbalance (max - min) / max, random split", _pct(47), (), "balance",
           "grlib.experiments.balance_stage.acceptance", Method("modelled", SIMULATED)),
    Target("C2.after", "per-rank load imbalance (max - min) / max, dynamic balancing", _pct(2.4),
           (Bound("imbalance", "<=", _pct(2.4)),), "balance", "grlib.experiments.balance_stage.acceptance",
           Method("modelled", SIMULATED)),
    Target("C2.measured", "measured imbalance of emulated ranks' shares, balanced vs random split", None,
           (Bound("balanced / random imbalance", "<=", Figure(1 / 3, "ratio")),), "balance",
           "grlib.experiments.balance_stage.acceptance",
           Method("measured", "each emulated rank's share of the same global batches timed alone on one thread "
                              "(one HSTU layer fwd+bwd), median over batches")),
    Target("C3.all_to_all", "all-to-all latency, hierarchical vs flat (change)", _pct(-75.9),
           (Bound("latency change", "<=", _pct(-75.9)),), "sparse", "grlib.experiments.sparse_stage.acceptance",
           Method("modelled", A2A_MODEL)),
    Target("C3.gloo_fit", "the alpha-beta model's error on all-to-alls timed here (gloo, loopback)", None,
           (Bound("max |model / measured - 1|", "<=", _pct(25)),), "sparse",
           "grlib.experiments.sparse_stage.acceptance",
           Method("measured", "all_to_all_single on gloo processes of this machine, 64 KiB .. 4 MiB per peer, "
                              "median of repeats; alpha + beta * m fitted per message to the same times")),
    Target("C3.inter_bytes", "inter-node bytes, hierarchical vs flat exchange of the same lookups", None,
           (Bound("|hierarchical - flat| / flat inter-node bytes", "<=", _pct(0)),), "sparse",
           "grlib.experiments.sparse_stage.acceptance",
           Method("measured", "LinkCounters of one row-sharded lookup of a training batch of the scale's data, "
                              "4 gloo ranks as 2 nodes x 2, ids and rows both ways")),
    Target("C3.dedup", "inter-node bytes, node de-duplication vs rank de-duplication", None, (), "sparse",
           "grlib.experiments.sparse_stage.acceptance",
           Method("measured", "LinkCounters of the same lookups, hierarchical: node-level merge of node-mates' "
                              "requests vs each rank's distinct ids")),
    Target("C4.convergence", "test NDCG@10 of semisync(k) vs sync, k <= 2 (2 ranks, sharded items)",
           "converges (proof in the paper), faster steps",
           (Bound("|NDCG@10 gap| within one sync seed-std or relative gap", "<=", _pct(1)),), "semi_async",
           "grlib.experiments.semi_async_stage.acceptance",
           Method("measured", "2 gloo ranks train the scale's HSTU with a row-sharded item table under "
                              "semisync(k) (input rows looked up k updates early), mean over seeds, full ranking")),
    Target("C5.utilisation", "accelerator utilisation with pipelined stages", _pct(94),
           (Bound("utilisation", ">=", _pct(94)),), "scaling", "grlib.experiments.scaling.stage.acceptance",
           Method("modelled", PIPELINE_MODEL)),
    Target("C5.measured", "compute / wall per rank, 2 gloo ranks, per schedule", None,
           (Bound("utilisation", ">=", _pct(94)),), "scaling", "grlib.experiments.scaling.stage.acceptance",
           Method("measured", "per rank and step: forward + loss + backward + optimizer minus the seconds inside "
                              "item all-to-alls, over the wall between step starts (one thread per rank, the "
                              "scale's model and data, sharded items, kk balance)")),
    Target("C5.validation", "the pipeline model's 2-rank step time vs the measured one, per schedule", None,
           (Bound("|predicted / measured - 1|", "<=", _pct(15)),), "scaling",
           "grlib.experiments.scaling.stage.acceptance",
           Method("modelled", "grlib.sim.pipeline on the compute model fitted to solo steps, gloo's alpha-beta "
                              "fitted here and the steps' exact rows, vs the median measured step")),
    Target("C6.sharing", "negatives per token and step time, shared pool vs per-token negatives",
           "larger effective negative set, no extra embedding lookups",
           (Bound("negatives vs per-token", ">=", _x(8)), Bound("step time vs per-token", "<=", _x(1.2))),
           "negatives", "grlib.experiments.negatives_stage.acceptance",
           Method("measured", "the smallest shared pool with enough negatives; median step time of the same "
                              "batches in interleaved rounds, vs the per-token baseline of the same run")),
    Target("C6.half", "negative-path memory and quality, half vs fp32 logits", "jaggedness-aware FP16 (no figure)",
           (Bound("memory vs fp32", "<=", _pct(55)), Bound("NDCG@10 change", "<", _pct(1))),
           "negatives", "grlib.experiments.negatives_stage.acceptance",
           Method("measured", "peak memory of sampling + loss + backward; test NDCG@10 after the same budget")),
    Target("C6.async", "step time, sampling in a worker vs samples made beforehand", "async offload (no figure)",
           (Bound("step time vs pre-sampled", "<=", _x(1.05)),), "negatives", "grlib.experiments.negatives_stage.acceptance",
           Method("measured", "median step time, same batches, interleaved rounds")),
    Target("C7.mfu", "model FLOPs utilisation of a training step", _pct(54.71),
           (Bound("MFU", ">=", _pct(54.71)),), "bench_train", "grlib.experiments.mfu.measure",
           Method("measured", "useful HSTU FLOPs (real lengths) per second of whole training steps / this "
                              "machine's nominal peak in the row's precision (cores x FLOP per cycle x clock: the "
                              "paper's convention); beside it the same over the GEMM peak of that precision measured "
                              "in the same run. The paper's figure is half precision: on a CPU with bf16 units "
                              "(amx_bf16, avx512_bf16) its bf16 rows judge and its fp32 rows are context; a CPU "
                              "without them judges in fp32 (grlib.experiments.report)")),
    Target("C7.bf16", "test NDCG@10 of HSTU trained in bf16 (projections on bf16 copies of fp32 weights) vs fp32, "
                      "mean over seeds, per dataset", None,
           (Bound("bf16 - fp32 difference in fp32 seed-stds", "<=", Figure(1, "ratio")),), "train_precision",
           "grlib.experiments.train_stage.precision_summary",
           Method("measured", "train stage: HSTU per seed in bf16 with the fp32 runs' data, settings and budget; "
                              "against the fp32 HSTU rows of the same run; not measured on this CPU where it has "
                              "no bf16 GEMMs (no avx512_bf16, or GRLIB_ISA below avx512: grlib.hardware.isa)")),
    Target("C7.scaling", "throughput scaling efficiency over devices", Figure(0.97, "ratio"),
           (Bound("scaling efficiency", ">=", Figure(0.97, "ratio")),), "scaling",
           "grlib.experiments.scaling.stage.acceptance", Method("modelled", PIPELINE_MODEL)),
    Target("C7.measured", "weak-scaling efficiency, 2 gloo processes vs 1 (tokens/s per rank)", None,
           (Bound("scaling efficiency", ">=", Figure(0.97, "ratio")),), "scaling",
           "grlib.experiments.scaling.stage.acceptance",
           Method("measured", "tokens/s per rank, same per-rank batch, one thread per process; 2 processes per "
                              "schedule (and 2 without communication) over 1 process alone")),
    Target("W1.quality", "test NDCG@10 (full ranking, mean over seeds) vs the popularity baseline", None,
           (Bound("NDCG@10 vs popularity", ">=", _x(1.5)),), "train", "grlib.experiments.report.train_summary",
           Method("measured", "train stage, newest row per (dataset, model, seed)")),
    Target("W1.peer", "test NDCG@10 of HSTU (full ranking, mean over seeds) vs a standard SASRec of a peer library "
                      "on the same data and protocol (RecBole 1.2.1 on ML-100K: 0.0973)", None,
           (Bound("HSTU NDCG@10 vs peer SASRec", ">=", _x(1)),), "train", "grlib.experiments.report.train_summary",
           Method("measured", "train stage, newest row per (dataset, model, seed), against the peer's figure "
                              "(grlib.experiments.train_stage.PEERS, with its source)")),
), "key")


def target(key: str) -> Target:
    """The registry's target `key` (read at call time: a changed registry changes every verdict)."""
    try:
        return TARGETS[key]
    except KeyError:
        raise KeyError(f"unknown claim target {key!r}; known: {', '.join(TARGETS)}") from None


def targets_of(claim: str) -> list[Target]:
    return [t for t in TARGETS.values() if t.claim == claim]
