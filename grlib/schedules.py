"""The schedule registry: every training schedule's name, traits and model cost, in one place.

A schedule is what runs ahead of step i while step i computes. Each is a class behind one interface,
`run(batches) -> one StepResult per batch` (the base: grlib.train.prefetch.SyncSchedule):

    one process  `cls(step, negatives)` via cls.of (grlib.train.prefetch: sync, prefetch), picked by
                 negatives.async_sampling
    a rank of N  `cls(step, planner, staleness, side, stream)` (grlib.distributed.schedules.RankSchedule:
                 sync, prefetch, semisync, overlap, pipelined), picked by dist.schedule

This module holds what the rest reads without importing torch: the CLI's --schedule choices, the
config's dist.schedule / staleness / bucket_bytes checks (grlib.config), grlib.fit's assembly (side
channel, buckets, stream), the pipeline model (grlib.sim.pipeline prices a schedule from its
ModelCost) and the scaling stage (grlib.experiments.scaling). A class names the schedule it runs
(`class Pipelined(RankSchedule, schedule=PIPELINED)`); the registry names no class, so what reads
the names and traits (the config, every stage) depends on no training code.

Adding a schedule is one file plus its model cost: a class (a subclass of RankSchedule, say) naming
it and a Spec with the ModelCost the pipeline model prices it by (None: the model refuses it). A
built-in one is a line in BUILTIN; any other is a plugin: a Python file defining GRLIB_SCHEDULES, a
tuple of Spec, and its classes, named in the environment variable GRLIB_SCHEDULES (files separated
by os.pathsep).
The registry imports those files the first time it is read, in every process (the ranks that
grlib.distributed.launch spawns inherit the variable), so `GRLIB_SCHEDULES=mine.py python -m grlib
train --world 2 --schedule mine` runs it. A missing file, a file without GRLIB_SCHEDULES, or a name
registered twice fails naming the file.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

PLUGINS_ENV = "GRLIB_SCHEDULES"


@dataclass(frozen=True)
class ModelCost:
    """How the pipeline model (grlib.sim.pipeline) prices one step of the schedule, by its lanes:

    plan_ahead         planning and the ids' trips on the worker lane, a step ahead (False: inline)
    rows_ahead         the input rows of batch i+k looked up at the start of step i (staleness k), and
                       the stale-row bookkeeping after the step
    overlap_allreduce  the dense gradients all-reduced in buckets beside backward (needs streams)
    sparse_stream      every trip of the item table on the communication stream (needs streams)"""

    plan_ahead: bool
    rows_ahead: bool = False
    overlap_allreduce: bool = False
    sparse_stream: bool = False

    def __post_init__(self) -> None:
        if (self.rows_ahead or self.sparse_stream) and not self.plan_ahead:
            raise ValueError("a ModelCost with rows_ahead or sparse_stream needs plan_ahead (the routes built ahead)")


@dataclass(frozen=True)
class Spec:
    """One schedule: its name, its traits and model cost (its classes name it: module note).

    stale         takes a staleness k (dist.staleness > 0 allowed)
    bucketed      the dense gradients go in buckets of dist.bucket_bytes during backward
    side_channel  a worker thread plans step i+1 during step i and builds a sharded table's routes on a
                  side channel of process groups (False: every step plans inline)
    stream        a sharded table's trips run on a communication stream"""

    name: str
    one_process: bool = False  # one process runs it too (grlib.train.prefetch), not only a rank of N
    stale: bool = False
    bucketed: bool = False
    side_channel: bool = False
    stream: bool = False
    model: ModelCost | None = None  # None: the pipeline model refuses it
    summary: str = ""  # one line for --help

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"a schedule name is letters, digits, '-' and '_'; got {self.name!r}")
        if self.stream and not (self.side_channel and self.bucketed):
            raise ValueError(f"schedule {self.name!r}: a stream needs the side channel and the buckets")

    def class_in(self, table: dict[str, type], kind: str) -> type:
        """This schedule's class in `table` (a class family's name -> class, filled as its classes
        are defined); `kind` names the family in the error."""
        if self.name not in table:
            raise ValueError(f"schedule {self.name!r} has no {kind} class (a class names it: "
                             f"class C(<{kind} base>, schedule={self.name!r}))")
        return table[self.name]


SYNC, PREFETCH, SEMISYNC, OVERLAP, PIPELINED = "sync", "prefetch", "semisync", "overlap", "pipelined"
BUILTIN = (
    Spec(SYNC, one_process=True, model=ModelCost(False), summary="plan each step inline"),
    Spec(PREFETCH, one_process=True, side_channel=True,
         model=ModelCost(True), summary="plan step i+1 (and its id all-to-alls) during step i"),
    Spec(SEMISYNC, stale=True, side_channel=True, model=ModelCost(True, rows_ahead=True),
         summary="prefetch, and input item rows looked up --staleness steps early"),
    Spec(OVERLAP, bucketed=True, side_channel=True,
         model=ModelCost(True, overlap_allreduce=True),
         summary="prefetch, dense gradients all-reduced in buckets during backward"),
    Spec(PIPELINED, stale=True, bucketed=True, side_channel=True, stream=True,
         model=ModelCost(True, rows_ahead=True, overlap_allreduce=True, sparse_stream=True),
         summary="semisync + overlap + a sharded item table's all-to-alls on a communication stream"),
)

# negatives.async_sampling -> the one-process schedule it runs (grlib.train.prefetch.build_schedule)
ONE_PROCESS = {False: SYNC, True: PREFETCH}

_registry: dict[str, Spec] = {}
_loaded: list[str] = []  # the plugin files imported so far


def register(spec: Spec) -> Spec:
    """Adds a schedule after the built-ins; a name registered already fails (the same Spec again is a no-op)."""
    _builtins()
    old = _registry.get(spec.name)
    if old is not None and old != spec:
        raise ValueError(f"schedule {spec.name!r} is registered already ({old})")
    _registry[spec.name] = spec
    return spec


def _builtins() -> None:
    if not _registry:
        _registry.update((s.name, s) for s in BUILTIN)


def _load() -> None:
    _builtins()
    for path in filter(None, os.environ.get(PLUGINS_ENV, "").split(os.pathsep)):
        path = str(Path(path).resolve())
        if path not in _loaded:
            _loaded.append(path)
            load_plugin(path)


def load_plugin(path: str | Path) -> tuple[Spec, ...]:
    """Imports a plugin file and registers its GRLIB_SCHEDULES (a tuple of Spec)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{PLUGINS_ENV}: no such schedule plugin file {str(file)!r}")
    name = f"grlib_schedule_plugin_{file.stem}"
    module = sys.modules.get(name)
    if module is None or getattr(module, "__file__", None) != str(file):
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    found = getattr(module, "GRLIB_SCHEDULES", None)
    if not isinstance(found, tuple) or not found or not all(isinstance(s, Spec) for s in found):
        raise ValueError(f"{PLUGINS_ENV}: {str(file)!r} defines no GRLIB_SCHEDULES, a tuple of grlib.schedules.Spec")
    for s in found:
        register(s)
    return found


def specs() -> tuple[Spec, ...]:
    """Every registered schedule, built-ins first (the order error messages and grids list them in)."""
    _load()
    return tuple(_registry.values())


def names() -> tuple[str, ...]:
    return tuple(s.name for s in specs())


def get(name: str) -> Spec:
    """The Spec of `name`; an unknown name fails listing the registered ones."""
    _load()
    if name not in _registry:
        raise ValueError(f"schedule must be one of {names()}, got {name!r} (more: a plugin file in ${PLUGINS_ENV})")
    return _registry[name]


def with_trait(trait: str) -> tuple[str, ...]:
    """The names of the schedules whose `trait` (stale, bucketed, side_channel, stream) holds."""
    return tuple(s.name for s in specs() if getattr(s, trait))



def priced() -> tuple[str, ...]:
    """The schedules the pipeline model prices (those that declare a ModelCost)."""
    return tuple(s.name for s in specs() if s.model is not None)


def modelled_as(cost: ModelCost, staleness: int = 1) -> str:
    """The first registered schedule whose model cost is `cost` (a modelled row's dist.schedule); at
    staleness 0 rows_ahead changes nothing the model prices, so it is not compared."""
    def same(m: ModelCost | None) -> bool:
        if m is None or staleness:
            return m == cost
        return dataclasses.replace(m, rows_ahead=False) == dataclasses.replace(cost, rows_ahead=False)

    found = [s.name for s in specs() if same(s.model)]
    if not found:
        raise ValueError(f"no registered schedule has the model cost {cost}")
    return found[0]

