"""NegativePath: sampling, looking up and scoring the negatives of the loss (see grlib.negatives).

Each step splits in two:
  sample(batch) -> NegativeSample     valid-token positions, targets, negative ids (no embedding values)
  loss(user, items, batch)            looks the rows up under the current weights and scores them

The path runs no thread of its own. By default `loss` samples on the critical path. `prepare(batch)`
draws the sample ahead and attaches it to the batch (`batch.attachments["negatives"]`), where
`loss` takes it: a schedule of grlib.train.prefetch calls it for the next `queue_depth` batches in a
background worker (`async_sampling: true`), the negatives ablation for pre-sampled steps. Staleness
choice: only ids are prepared ahead; the embedding rows are gathered inside `loss`, from the
weights of the current step, so the negatives' logits and their gradients are exact (zero
staleness), and a prepared sample holds exactly the ids the inline path draws (same generator,
same order), so async training trains the same model. Gathering values ahead would score
negatives with weights one or more optimizer steps old and still need a second lookup for their
gradients.

Full softmax (NegativesConfig.softmax "full", or "auto" where the catalogue's V - 2 real items are no
more than n_negatives): the sample's pool is every real item (NegativePath docstring), the rest of
the path unchanged.

Lookups: `loss` asks the item table (grlib.model.embeddings.ItemTable) for the distinct ids of the
batch's targets and negatives only, once each ([U, d], U <= min(V, P + P*R)), and scores in that
local row space (the scoring functions index the U rows; logQ is gathered to them too). Only those
rows are L2-normalised, and their gradients are summed per row before the normalisation's
backward, so the numbers are those of scoring against the whole normalised [V, d] table, bit for
bit, without touching the V - U other rows.

Checkpoints: `state_dict()` is the sampler state as of the next batch to train. A worker draws
ahead, so the live generator state is that of a batch still in the queue; instead each prepared
sample carries the generator state right after its draw, and `loss` records it when it consumes
the sample. Restoring that state and restarting the data at the next batch redraws exactly the
ids the uninterrupted run draws (and the sync path's ids: a checkpoint resumes with or without
async sampling). Re-seeding per step would also resume exactly but would draw other ids than the
sync path, which would no longer train the same model.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields

import numpy as np
import torch
from torch import Tensor

from grlib.config import NegativesConfig
from grlib.schema import FIRST_ITEM_ID
from grlib.jagged import JaggedBatch
from grlib.model.embeddings import ItemTable
from grlib.negatives.samplers import InBatchSampler, Sampler, build_sampler
from grlib.negatives.scoring import per_token_lse, sampled_softmax, shared_lse, shared_softmax_loss

ATTACHMENT = "negatives"  # key of a prepared sample in batch.attachments


@dataclass
class NegativeSample:
    """The negatives of one batch, ready to score (CPU or device tensors)."""

    keep: Tensor  # [P] int64: positions among the batch's T tokens of the tokens with a target
    targets: Tensor  # [P] int64
    ids: Tensor  # [P, R] int32 (per-token) or [R] int64 (shared): negative item ids

    @property
    def shared(self) -> bool:
        return self.ids.dim() == 1

    def to(self, device: torch.device) -> "NegativeSample":
        if self.keep.device == device:
            return self
        return NegativeSample(*(getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)))

    def nbytes(self) -> int:
        return sum(getattr(self, f.name).numel() * getattr(self, f.name).element_size() for f in fields(self))


@dataclass
class PreparedSample:
    """A sample drawn ahead (batch.attachments[ATTACHMENT]) with the generator state right after its
    draw, stamped by the path that drew it (its stamp changes with each load_state_dict)."""

    sample: NegativeSample
    state: Tensor
    stamp: object

    def to(self, device: torch.device) -> "PreparedSample":
        return PreparedSample(self.sample.to(device), self.state, self.stamp)


@dataclass
class LocalIds:
    """A sample's ids in the row space of its distinct ids: rows = items.lookup(distinct)."""

    distinct: Tensor  # [U] int64 ascending: every target and negative id, once
    targets: Tensor  # [P] int64: distinct[targets] = sample.targets
    ids: Tensor  # [P, R] or [R], the sample's id dtype: distinct[ids] = sample.ids

    @classmethod
    def of(cls, sample: NegativeSample, n_items: int) -> "LocalIds":
        """Numpy, O(P + P*R + V) with a mask over the vocabulary (sorting when the ids are few)."""
        t, ids = sample.targets.cpu().numpy(), sample.ids.cpu().numpy()
        flat = np.concatenate([t, ids.reshape(-1).astype(np.int64, copy=False)])  # [P + P*R] or [P + R]
        if flat.size * 8 < n_items:  # a few ids of a large vocabulary
            distinct, inverse = np.unique(flat, return_inverse=True)
        else:
            present = np.zeros(n_items, dtype=bool)
            present[flat] = True
            distinct = np.flatnonzero(present)
            inverse = (np.cumsum(present) - 1)[flat]
        return cls(torch.from_numpy(distinct.astype(np.int64, copy=False)),
                   torch.from_numpy(inverse[:t.size].astype(np.int64)),
                   torch.from_numpy(inverse[t.size:].astype(ids.dtype).reshape(ids.shape)))

    def to(self, device: torch.device) -> "LocalIds":
        return LocalIds(*(getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)))


class NegativePath:
    """The configured negative path: sampler x sharing x precision (NegativesConfig); sampled inline
    or prepared ahead (async_sampling is the schedule's choice, grlib.train.prefetch).

    With a full softmax (cfg.full_softmax(n_items)) the pool is the whole catalogue: every token
    scores every real item, shared, with no draw (the generator never moves), no logQ, the target
    masked among the pool as an accidental hit; so the loss is the cross-entropy over the V - 2 real
    items, on the same fused shared path (chunked: no [P, V] tensor held)."""

    def __init__(self, cfg: NegativesConfig, n_items: int, item_counts: np.ndarray | None = None, seed: int = 0):
        self.cfg, self.n_items = cfg, n_items
        self.full = cfg.full_softmax(n_items)
        self.sampler: Sampler = build_sampler(cfg.sampler, n_items, item_counts)
        # [V] or None (uniform: it cancels; full softmax: nothing is sampled)
        self.logq = self.sampler.log_q() if cfg.logq and not self.full else None
        self.catalogue = torch.arange(FIRST_ITEM_ID, n_items) if self.full else None  # [V - 2] the full pool
        self.generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()  # the generator is shared by a prefetch worker and inline sampling
        self._stamp = object()  # marks the samples this path drew since it was made or last restored
        self._trained_state = self.generator.get_state()  # generator state after the last sample `loss` used

    # --- sampling (off the critical path when prepared ahead) ------------------------------------
    def sample(self, batch: JaggedBatch) -> NegativeSample:
        """Numpy only, no torch kernel, so that it may run in a worker thread (grlib.negatives.samplers)."""
        return self._draw(batch).sample

    def prepare(self, batch: JaggedBatch) -> None:
        """Draws the batch's sample now and attaches it for the `loss` call on this batch (thread-safe)."""
        batch.attachments[ATTACHMENT] = self._draw(batch)

    def attach(self, batch: JaggedBatch, sample: NegativeSample) -> None:
        """Attaches a sample made elsewhere for the `loss` call on this batch (the sampler state
        recorded with it is the current one)."""
        batch.attachments[ATTACHMENT] = PreparedSample(sample, self.generator.get_state(), self._stamp)

    def _draw(self, batch: JaggedBatch) -> PreparedSample:
        t = batch.targets.numpy()  # [T] (CPU)
        keep_np = np.flatnonzero(t > 0)  # [P]
        keep, targets = torch.from_numpy(keep_np), torch.from_numpy(t[keep_np])  # [P], [P]
        R = self.cfg.n_negatives
        with self._lock:
            if self.catalogue is not None:  # full softmax: nothing drawn
                ids = self.catalogue  # [V - 2]
            elif self.cfg.sharing == "shared":
                if isinstance(self.sampler, InBatchSampler):
                    ids = self.sampler.pool(targets, R, self.generator)  # [min(P, R)]
                else:
                    ids = self.sampler.draw((R,), targets, self.generator)  # [R]
            else:
                small = torch.int32 if self.n_items < 2**31 else torch.int64  # half the bytes of [P, R]
                ids = self.sampler.draw((targets.numel(), R), targets, self.generator, small)  # [P, R]
            return PreparedSample(NegativeSample(keep, targets, ids), self.generator.get_state(), self._stamp)

    def _take(self, batch: JaggedBatch) -> NegativeSample:
        """The batch's prepared sample (removed from it), or one drawn now."""
        got = batch.attachments.pop(ATTACHMENT, None)
        if got is None:
            got = self._draw(batch)
        elif got.stamp is not self._stamp:
            raise RuntimeError("NegativePath.loss: this batch's negatives were prepared by another path, or "
                               "by this one before load_state_dict; prepare it again")
        self._trained_state = got.state
        return got.sample

    # --- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Tensor]:
        """The sampler state as of the next batch to train: the generator state right after the
        sample of the last batch `loss` scored (not the live state, which a worker has moved on)."""
        return {"generator": self._trained_state.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restores state_dict(); the next batch sampled (inline or prepared) draws what the saved
        run drew next. Samples prepared before this call are refused by `loss`."""
        with self._lock:
            self.generator.set_state(state["generator"])
            self._trained_state = self.generator.get_state()
            self._stamp = object()

    # --- scoring (the critical path) -----------------------------------------------------------
    def loss(self, user: Tensor, items: ItemTable, batch: JaggedBatch) -> Tensor:
        """user [T, d] normalised; items: the item table (rows looked up normalised); batch.targets [T]
        -> scalar."""
        s = self._take(batch)
        local = LocalIds.of(s, self.n_items).to(user.device)
        s = s.to(user.device)
        rows = items.lookup(local.distinct)  # [U, d] normalised: each target and negative row once
        u = user.index_select(0, s.keep) / self.cfg.temperature  # [P, d]: valid tokens only, scaled by 1/tau
        pos = (u * rows.index_select(0, local.targets)).sum(-1)  # [P] fp32
        logq = None if self.logq is None else self.logq.to(user.device)[local.distinct]  # [U]
        if logq is not None:
            pos = pos - logq[local.targets]
        if s.shared:
            pool = rows.index_select(0, local.ids)  # [R, d]: R rows for the whole batch
            if self.cfg.precision == "fp32":  # gradients made in the forward pass: no recomputed logits
                return shared_softmax_loss(u, pool, pos, local.ids, local.targets, logq)
            lse = shared_lse(u, pool, local.ids, local.targets, logq, self.cfg.precision)  # [P]
        else:
            lse = per_token_lse(u, rows, local.ids, local.targets, logq, self.cfg.precision)  # [P]
        return sampled_softmax(pos, lse)


def sample_stats(sample: NegativeSample) -> dict[str, float]:
    """Per-batch figures of a sample: tokens scored, negatives per token (accidental hits excluded),
    distinct negatives per token, and embedding rows looked up (negatives; positives apart)."""
    P = sample.targets.numel()
    if P == 0:
        return {"tokens": 0, "negatives_per_token": 0.0, "distinct_negatives_per_token": 0.0,
                "negative_rows": 0, "positive_rows": 0}
    ids = sample.ids.long()
    R = ids.shape[-1]
    hits = (ids.unsqueeze(0) if sample.shared else ids) == sample.targets[:, None]  # [P, R]
    valid = R - hits.sum(1).double()  # [P]
    if sample.shared:
        distinct = ids.unique().numel() - hits.any(1).double()  # [P]
    else:
        srt = ids.sort(1).values  # [P, R]
        distinct = 1 + (srt[:, 1:] != srt[:, :-1]).sum(1).double() - hits.any(1).double()
    return {"tokens": P, "negatives_per_token": float(valid.mean()),
            "distinct_negatives_per_token": float(distinct.mean()),
            "negative_rows": int(ids.numel()), "positive_rows": P}


def build_negative_path(cfg: NegativesConfig, n_items: int, item_counts: np.ndarray | None = None,
                        seed: int = 0) -> NegativePath:
    """The negative path configured by cfg (item_counts: training target counts per item, needed by
    the popularity and in-batch samplers)."""
    return NegativePath(cfg, n_items, item_counts, seed)
