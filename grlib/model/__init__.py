"""Sequence encoders over jagged batches: HSTU and the SASRec baseline."""
from grlib.model.hstu import HSTU, SASRec, build_model, count_parameters

__all__ = ["HSTU", "SASRec", "build_model", "count_parameters"]
