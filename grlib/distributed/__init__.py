"""grlib's multi-process runtime on torch.distributed: the same code on CPU (gloo), CUDA (nccl) and
Ascend (hccl, torch_npu), started by torchrun or by grlib.distributed.launch.

    topology  Topology (rank, world, nodes x local_world from torchrun's variables), check_world,
              init_runtime -> Runtime (the process group, its per-node and cross-node subgroups)
    launch    launch(fn, world, nodes=...) -> [fn(runtime, ...) of each rank]; RankFailed; free_port
    balance   balancers of a global batch's sequences over ranks (none: contiguous, random, snake, lpt, kk)
    cost      the per-sequence cost model: one HSTU layer calibrated (c0 + a*s + b*s^2), or FLOPs
    data_parallel  N ranks train what one process trains (balanced shares, gradients all-reduced)
    alltoall  flat and two-stage (hierarchical) all-to-all, Route (request/response lookups), link counters
    sharded_embedding  the item table sharded row-wise behind the ItemTable seam
    torchrec_peer  TorchRec's row-wise EmbeddingCollection as a peer (optional extra)
"""
from grlib.distributed.launch import RankFailed, free_port, launch
from grlib.distributed.topology import (
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
