"""Data: dataset registry and download, streaming preprocessing into per-user sequences, the
calibrated synthetic twin, MovieLens-100K, jagged batches, and the catalogue that names each prepared
folder (see each module). The KuaiRand log schema they share is grlib.schema (the base layer)."""
