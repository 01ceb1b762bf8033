"""The per-sequence backends `loop` (eager PyTorch) and `loop_compile` (torch.compile): attention's
dense causal attention per sequence, the non-padded peers of the compiled kernel."""
