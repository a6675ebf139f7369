"""V1 helpers at upstream's module path (upstream: vllm/v1/utils.py)."""

import torch

from vllm.utils import ConstantList


def tensor_data(tensor: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (any dtype, on CPU, contiguous), for hashing
    and serializing."""
    return tensor.flatten().cpu().contiguous().view(torch.uint8).numpy().data


__all__ = ["ConstantList", "tensor_data"]
