"""Building an encoder from its config, and counting its parameters (dense vs embedding rows).

The paper preset (about 0.2B parameters) is counted on the meta device: nothing is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grlib.config import ModelConfig
from grlib.model.embeddings import embedding_parameters
from grlib.model.hstu import HSTU
from grlib.model.sasrec import SASRec


def build_model(cfg: ModelConfig, n_items: int, max_len: int = 4096,
                device: str | torch.device = "cpu") -> nn.Module:
    """HSTU or SASRec for a vocabulary of n_items ids (pad and OOV included); max_len bounds
    SASRec's absolute positions. device='meta' builds without allocating."""
    if n_items < 3:
        raise ValueError(f"n_items must be >= 3 (pad, OOV and one item), got {n_items}")
    with torch.device(device):
        if cfg.name == "hstu":
            return HSTU(cfg, n_items)
        if cfg.name == "sasrec":
            return SASRec(cfg, n_items, max_len)
    raise ValueError(f"model.name={cfg.name!r} has no neural encoder (popularity is scored in grlib.evaluate)")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class ParameterCount:
    dense: int  # encoder weights, action / time / position tables
    embedding: int  # item table rows (sparse: one row per item id)

    @property
    def total(self) -> int:
        return self.dense + self.embedding

    def __str__(self) -> str:
        return (f"{human(self.total)} parameters ({human(self.dense)} dense + "
                f"{human(self.embedding)} item embeddings)")


def parameter_count(model: nn.Module) -> ParameterCount:
    sparse = {id(p) for p in embedding_parameters(model)}
    emb = sum(p.numel() for p in model.parameters() if id(p) in sparse)
    return ParameterCount(dense=count_parameters(model) - emb, embedding=emb)


def preset_parameters(cfg: ModelConfig, n_items: int, max_len: int) -> ParameterCount:
    """The parameter count of a preset, built on the meta device (no memory allocated)."""
    return parameter_count(build_model(cfg, n_items, max_len, device="meta"))


def human(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))
