"""Tensor helpers (upstream: vllm/utils/torch_utils.py)."""

from __future__ import annotations

from typing import Any

import torch


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor over `tensor`'s memory that does not keep that memory alive.

    For the outputs a CUDA graph keeps between replays: holding them strongly
    would pin each graph's memory in the pool, so that graphs captured later
    could not reuse it. The caller guarantees the memory is not handed to
    anything else while the view is read (graph replays are sequential)."""
    storage = tensor.untyped_storage()
    weak = torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), tensor.device, storage.nbytes()
    )
    out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return out.set_(weak, tensor.storage_offset(), tensor.shape, tensor.stride())


def weak_ref_tensors(value: Any) -> Any:
    """`weak_ref_tensor` over a tensor, or the tensors of a list / tuple;
    anything else is returned as it is."""
    if isinstance(value, torch.Tensor):
        return weak_ref_tensor(value)
    if isinstance(value, (list, tuple)):
        return type(value)(weak_ref_tensors(v) for v in value)
    return value
