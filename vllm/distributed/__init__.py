"""Distributed execution: process groups and collectives (upstream: vllm/distributed).

`parallel_state.py`: `GroupCoordinator` and the TP / PP groups (gloo on CPU,
NCCL on GPU); `communication_op.py`: the collectives the layers call;
`device_communicators/`: the shared-memory `MessageQueue` the multiprocess
executor talks to its workers through, and its msgpack RPC codec;
`kv_events.py`: the KV cache event records.
"""

from vllm.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_gather,
)
from vllm.distributed.parallel_state import (
    GroupCoordinator,
    destroy_distributed_environment,
    destroy_model_parallel,
    ensure_model_parallel_initialized,
    get_pipeline_model_parallel_rank,
    get_pipeline_model_parallel_world_size,
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
    get_world_group,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
)
from vllm.distributed.utils import divide, get_pp_indices

__all__ = [
    "GroupCoordinator",
    "destroy_distributed_environment",
    "destroy_model_parallel",
    "divide",
    "ensure_model_parallel_initialized",
    "get_pipeline_model_parallel_rank",
    "get_pipeline_model_parallel_world_size",
    "get_pp_group",
    "get_pp_indices",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
    "get_tp_group",
    "get_world_group",
    "init_distributed_environment",
    "initialize_model_parallel",
    "model_parallel_is_initialized",
    "tensor_model_parallel_all_gather",
    "tensor_model_parallel_all_reduce",
    "tensor_model_parallel_gather",
]
