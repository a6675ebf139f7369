"""Collectives over the tensor-parallel group (upstream:
vllm/distributed/communication_op.py). With one rank they are the identity."""

from __future__ import annotations

import torch

from vllm.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum `input_` over the tensor-parallel ranks."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every tensor-parallel rank's `input_` along `dim`."""
    return get_tp_group().all_gather(input_, dim)


def tensor_model_parallel_gather(
    input_: torch.Tensor, dst: int = 0, dim: int = -1
) -> torch.Tensor | None:
    """Concatenation along `dim` on tensor-parallel rank `dst`, None elsewhere."""
    return get_tp_group().gather(input_, dst, dim)
