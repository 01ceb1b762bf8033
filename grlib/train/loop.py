"""The training loop: epochs of jagged batches through the one training step (grlib.train.step),
run by a built schedule (grlib.train.prefetch on one process, grlib.fit.assemble for 1 or N ranks).

    result = train(model, data, cfg.train, cfg.data.max_len, cfg.negatives,
                   validate=fn, checkpoint_dir=dir, checkpoint_every=100)

Per step it records a timeline (data, forward, loss, backward, optimizer seconds), the loss, the
learning rate and the useful FLOPs of the batch (grlib.perf). With `validate` (model -> metrics)
it evaluates after every epoch and, when cfg.select_best, ends with the weights of the best
epoch by validation NDCG@10. With `checkpoint_dir` it writes `last.pt` every `checkpoint_every`
steps and at each epoch end, and resumes from it (exactly, see grlib.train.checkpoint), saying so
on stderr. `identity` (e.g. the data and model settings) is stored with each checkpoint, and a
resume whose identity, train settings, negative path or model differ is refused, naming what.

`schedule` is the built schedule the steps come from (its step holds the negative path and the
optimizers the checkpoints save): by default one process's (grlib.train.prefetch.one_process).
grlib.fit.assemble builds it for 1 or N ranks; a rank of N (grlib.distributed.schedules.RankSchedule) runs this
loop on the same global batches and trains its share (the losses are the global batch's). Each rank
checkpoints its own file, last.rank<r>-of-<N>.pt, and resumes only on the same world size.
"""
from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn

from grlib.config import NegativesConfig, TrainConfig
from grlib.data.sequences import SequenceData
from grlib.jagged import JaggedBatch
from grlib.progress import bar
from grlib.train import checkpoint
from grlib.train.optim import Optimizers
from grlib.train.prefetch import SyncSchedule, one_process
from grlib.train.step import PHASES, StepResult

SELECT_METRIC = "ndcg@10"


@dataclass
class TrainResult:
    steps: int = 0
    seconds: float = 0.0  # wall time of the steps run in this call (resumed steps excluded)
    tokens: int = 0  # tokens processed in this call
    losses: list[float] = field(default_factory=list)  # every step since step 1 (resume keeps them)
    timeline: list[dict[str, float]] = field(default_factory=list)  # per step of this call
    val_history: list[dict[str, float]] = field(default_factory=list)  # per epoch: epoch, step, metrics
    best_epoch: int = -1
    resumed_from: int = 0  # the checkpoint's step, 0 for a fresh run

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def timeline_frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.timeline)

    def phase_seconds(self) -> dict[str, float]:
        """Mean seconds per step of each phase."""
        if not self.timeline:
            return {p: 0.0 for p in PHASES}
        return {p: float(np.mean([r[f"{p}_s"] for r in self.timeline])) for p in PHASES}


@dataclass
class _Position:
    step: int = 0
    epoch: int = 0
    batch: int = 0  # batches of the current epoch already trained
    epoch_rng: dict | None = None  # data-order RNG state at the start of the current epoch


def train(model: nn.Module, data: SequenceData, cfg: TrainConfig, max_len: int, negatives: NegativesConfig,
          *, validate: Callable[[nn.Module], dict[str, float]] | None = None,
          checkpoint_dir: str | Path | None = None, checkpoint_every: int = 0, resume: bool = True,
          flops_fn: Callable[[JaggedBatch], float] | None = None,
          identity: dict[str, Any] | None = None, schedule: SyncSchedule | None = None) -> TrainResult:
    """Trains `model` in place; deterministic per cfg.seed (given the same initial weights)."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    if schedule is None:
        schedule = one_process(model, data.n_items, data.train_item_counts(), cfg, negatives)
    world, rank = schedule.world, schedule.rank
    path, opt = schedule.step.path, schedule.step.opt
    pos, result, best = _Position(), TrainResult(), {"state": None, "metric": -np.inf}
    name = "last.pt" if world == 1 else f"last.rank{rank}-of-{world}.pt"
    ckpt = Path(checkpoint_dir) / name if checkpoint_dir else None
    run = _RunIdentity(cfg, negatives, {**(identity or {}), **({"world": world} if world > 1 else {})})
    per_epoch = data.n_train_batches(cfg.batch_size)
    total = cfg.epochs * per_epoch if not cfg.max_steps else min(cfg.epochs * per_epoch, cfg.max_steps)
    if ckpt and resume and ckpt.exists():
        _restore(ckpt, checkpoint.load(ckpt), model, opt, path, rng, pos, result, best, run)
        if pos.step >= total or pos.epoch >= cfg.epochs:  # trains nothing: steps == resumed_from on return
            print(f"{ckpt}: the run is finished (step {pos.step} of {total}); nothing left to train "
                  f"(a larger --max-steps or train.epochs goes on)", file=sys.stderr, flush=True)
        else:
            print(f"resuming from {ckpt} at step {pos.step} (epoch {pos.epoch}, batch {pos.batch})",
                  file=sys.stderr, flush=True)
    save = (lambda: checkpoint.save(ckpt, _snapshot(model, opt, path, pos, result, best, run))) if ckpt else None
    model.train()
    with bar(total, desc="train", initial=pos.step) as pbar:
        while pos.epoch < cfg.epochs and pos.step < total:
            if pos.batch == 0:
                pos.epoch_rng = rng.bit_generator.state
            rng.bit_generator.state = pos.epoch_rng
            raw = itertools.islice(data.train_batches(cfg.batch_size, max_len, rng), pos.batch, None)
            with closing(schedule.run(raw)) as steps:
                for out in steps:
                    pos.step, pos.batch = pos.step + 1, pos.batch + 1
                    record = _record(out, flops_fn)
                    record.update(step=pos.step, epoch=pos.epoch)
                    result.timeline.append(record)
                    result.losses.append(record["loss"])
                    result.tokens += record["tokens"]
                    result.seconds += sum(record[f"{p}_s"] for p in PHASES)
                    pbar.set_postfix(loss=f"{record['loss']:.3f}", refresh=False)
                    pbar.update(1)
                    if save and checkpoint_every and pos.step % checkpoint_every == 0:
                        save()
                    if pos.step >= total:
                        break
            if pos.batch >= per_epoch or pos.step >= total:  # the epoch is over, or cut by max_steps
                # a cut epoch keeps its position, so a resume with a larger max_steps continues it
                _end_epoch(model, validate, cfg, pos, result, best, advance=pos.batch >= per_epoch)
                if save:
                    save()
    if cfg.select_best and best["state"] is not None:
        model.load_state_dict(best["state"])
    result.steps = pos.step
    model.eval()
    return result


def _record(out: StepResult, flops_fn: Callable[[JaggedBatch], float] | None) -> dict[str, float]:
    """The timeline row of one step."""
    batch = out.batch
    return {"loss": out.loss, "lr": out.lr, "grad_norm": out.grad_norm,
            "tokens": int(batch.item_ids.numel()), "targets": int((batch.targets > 0).sum()),
            "flops": float(flops_fn(batch)) if flops_fn else float("nan"),
            **{f"{p}_s": out.seconds[p] for p in PHASES}, **out.extra}


def _end_epoch(model, validate, cfg: TrainConfig, pos: _Position, result: TrainResult, best: dict,
               advance: bool = True) -> None:
    if validate is not None:
        model.eval()
        metrics = validate(model)
        model.train()
        result.val_history.append({"epoch": pos.epoch, "step": pos.step, **metrics})
        if metrics[SELECT_METRIC] > best["metric"]:
            best["metric"] = metrics[SELECT_METRIC]
            best["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            result.best_epoch = pos.epoch
    if advance:
        pos.epoch, pos.batch = pos.epoch + 1, 0


# Fields of TrainConfig that must match for a checkpoint to be resumed (epochs / max_steps may grow).
_RESUME_FIELDS = ("batch_size", "lr", "weight_decay", "seed", "warmup_steps", "grad_clip", "embedding_optimizer")
# Fields of NegativesConfig that may differ: async and sync sampling draw the same ids.
_FREE_NEGATIVES_FIELDS = ("async_sampling", "queue_depth")


@dataclass
class _RunIdentity:
    """What a checkpoint must agree with to be resumed."""

    cfg: TrainConfig
    negatives: NegativesConfig
    extra: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"train": {f: getattr(self.cfg, f) for f in _RESUME_FIELDS},
                "negatives": {f: v for f, v in vars(self.negatives).items() if f not in _FREE_NEGATIVES_FIELDS},
                **self.extra}


def _snapshot(model, opt: Optimizers, path, pos: _Position, result: TrainResult, best: dict,
              run: _RunIdentity) -> dict[str, Any]:
    ident = run.as_dict()
    return {
        "config": ident.pop("train"), "identity": ident, "model_signature": checkpoint.model_signature(model),
        "model": model.state_dict(), "optimizers": opt.state_dict(), "negatives": checkpoint.path_state(path),
        "position": vars(pos).copy(), "torch_rng": torch.get_rng_state(),
        "losses": list(result.losses), "val_history": list(result.val_history), "best_epoch": result.best_epoch,
        "best": best,
    }


def _restore(ckpt: Path, state: dict, model, opt: Optimizers, path, rng, pos: _Position, result: TrainResult,
             best: dict, run: _RunIdentity) -> None:
    here = run.as_dict()
    differ = checkpoint.differences({"train": state["config"]}, {"train": here.pop("train")})
    if "identity" in state:  # (checkpoints written before these were stored are checked on train.* only)
        differ += checkpoint.differences(state["identity"], here)
    if "model_signature" in state and not differ:  # (settings that differ explain the shapes that do)
        differ += checkpoint.model_differences(state["model_signature"], model)
    checkpoint.refuse(ckpt, differ)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:  # a checkpoint older than model signatures
        checkpoint.refuse(ckpt, [" ".join(str(err).split())[:300]])
    opt.load_state_dict(state["optimizers"])
    checkpoint.load_path_state(path, state["negatives"])
    for k, v in state["position"].items():
        setattr(pos, k, v)
    torch.set_rng_state(state["torch_rng"])
    if pos.epoch_rng is not None:
        rng.bit_generator.state = pos.epoch_rng
    result.losses = list(state["losses"])
    result.val_history = list(state["val_history"])
    result.best_epoch = state["best_epoch"]
    result.resumed_from = pos.step
    best.update(state["best"])
