"""Data: KuaiRand log schema, dataset registry and download, streaming preprocessing into per-user
sequences, the calibrated synthetic twin, MovieLens-100K, jagged batches (see each module)."""
