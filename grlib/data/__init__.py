"""Data: KuaiRand log schema, dataset registry and download, streaming preprocessing into per-user
sequences, the calibrated synthetic twin, MovieLens-100K, jagged batches, and the catalogue that
names each prepared folder (see each module)."""
