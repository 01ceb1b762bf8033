"""The Triton backend (CUDA; on CPU under TRITON_INTERPRET=1, for tests): attention (hstu_attention,
forward and backward)."""
