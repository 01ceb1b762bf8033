"""The negative path of the loss: sampling negatives, looking up their embeddings, scoring them.

The trainer sees one object, a NegativePath:

    path = build_negative_path(cfg.negatives, item_counts)
    for batch in path.wrap(batches):        # may attach pre-sampled negatives (batch.negatives)
        user = model(batch)                  # [T, d]
        loss = path.loss(user, model.embed, batch)
    path.close()

Baseline (HSTU public practice): `n_negatives` uniform negatives per target token, L2-normalised
embeddings, dot product / temperature, accidental hits masked.
"""
from grlib.negatives.path import NegativePath, build_negative_path, sampled_softmax_loss

__all__ = ["NegativePath", "build_negative_path", "sampled_softmax_loss"]
