"""Sequence encoders over jagged batches: HSTU and the SASRec baseline, on shared embeddings.

    model = build_model(cfg.model, data.n_items, cfg.data.max_len)
    user = model(batch)                      # [T, d], L2-normalised, one vector per token
    scores = model.embed.score_all(user[last])  # [B, V]: the item table through ItemTable
"""
from grlib.model.build import (ParameterCount, build_model, count_parameters, parameter_count,
                               preset_parameters)
from grlib.model.embeddings import Embeddings, ItemTable, embedding_parameters
from grlib.model.hstu import HSTU, HSTULayer
from grlib.model.sasrec import SASRec

__all__ = ["HSTU", "HSTULayer", "SASRec", "Embeddings", "ItemTable", "ParameterCount", "build_model",
           "count_parameters", "embedding_parameters", "parameter_count", "preset_parameters"]
