"""grlib's multi-process runtime on torch.distributed: the same code on CPU (gloo), CUDA (nccl) and
Ascend (hccl, torch_npu), started by torchrun or by grlib.dist.launch.

    topology  Topology (rank, world, nodes x local_world from torchrun's variables), check_world,
              init_runtime -> Runtime (the process group, its per-node and cross-node subgroups)
    launch    launch(fn, world, nodes=...) -> [fn(runtime, ...) of each rank]; RankFailed; free_port
"""
from grlib.dist.launch import RankFailed, free_port, launch
from grlib.dist.topology import (
    BACKENDS,
    Runtime,
    Topology,
    TopologyError,
    check_world,
    init_runtime,
    is_distributed,
)

__all__ = ["BACKENDS", "RankFailed", "Runtime", "Topology", "TopologyError", "check_world", "free_port",
           "init_runtime", "is_distributed", "launch"]
