"""The negative path of the loss: sampling negatives, looking up their embeddings, scoring them.

The trainer sees one object, a NegativePath (no threads: prefetching is a schedule of grlib.train):

    path = build_negative_path(cfg.negatives, n_items, item_counts, seed)
    path.prepare(batch)                      # optional, e.g. in a prefetch worker: the sample, drawn ahead
    user = model(batch)                      # [T, d]
    loss = path.loss(user, model.embed, batch)   # model.embed: the item table (ItemTable)
    state = path.state_dict()                # the sampler state as of the next batch (exact resume)

Configured by NegativesConfig (params.yaml `negatives`):
  sampler         uniform | popularity (logQ-corrected) | in-batch (logQ-corrected); hits masked
  sharing         per-token (R ids per token, HSTU public practice) | shared (one pool of R per batch,
                  scored by every token with one [P, d] x [d, R] GEMM: intra-batch logit sharing)
  precision       fp32 | fp16 | bf16: negative rows held and multiplied in half precision for the
                  valid tokens only; logits, softmax and loss in FP32 (jaggedness-aware FP16)
  softmax         sampled (the sampler's negatives) | full (every real item: the cross-entropy over the
                  catalogue, for small catalogues) | auto (full where V - 2 <= n_negatives)
  async_sampling  the ids of step i+1 drawn by a background worker during step i (the trainer's
                  prefetch schedule, grlib.train.prefetch, calls `prepare`)

Modules: samplers (distributions), scoring (logits and loss), path (the NegativePath), memory (peak
memory of a region). The speed / quality ablation is the negatives stage's method
(grlib.experiments.negatives_stage).
"""
from grlib.negatives.path import NegativePath, NegativeSample, build_negative_path, sample_stats
from grlib.negatives.scoring import sampled_softmax_loss

__all__ = ["NegativePath", "NegativeSample", "build_negative_path", "sample_stats", "sampled_softmax_loss"]
