"""The negative path of the loss: sampling negatives, looking up their embeddings, scoring them.

The trainer sees one object, a NegativePath:

    path = build_negative_path(cfg.negatives, n_items, item_counts, seed)
    for batch in path.wrap(batches):        # async: a worker samples the next batches' negatives
        user = model(batch)                  # [T, d]
        loss = path.loss(user, model.embed, batch)
    path.close()

Configured by NegativesConfig (params.yaml `negatives`):
  sampler         uniform | popularity (logQ-corrected) | in-batch (logQ-corrected); hits masked
  sharing         per-token (R ids per token, HSTU public practice) | shared (one pool of R per batch,
                  scored by every token with one [P, d] x [d, R] GEMM: intra-batch logit sharing)
  precision       fp32 | fp16 | bf16: negative rows held and multiplied in half precision for the
                  valid tokens only; logits, softmax and loss in FP32 (jaggedness-aware FP16)
  async_sampling  ids, masks and logQ of step i+1 drawn by a background worker during step i

Modules: samplers (distributions), scoring (logits and loss), offload (the worker), path (the
NegativePath), memory (peak memory of a region). The speed / quality ablation is the negatives
stage's method (grlib.experiments.negatives_stage).
"""
from grlib.negatives.offload import NegativeSamplerError, PrefetchWorker
from grlib.negatives.path import NegativePath, NegativeSample, build_negative_path, sample_stats
from grlib.negatives.scoring import sampled_softmax_loss

__all__ = ["NegativePath", "NegativeSample", "NegativeSamplerError", "PrefetchWorker",
           "build_negative_path", "sample_stats", "sampled_softmax_loss"]
