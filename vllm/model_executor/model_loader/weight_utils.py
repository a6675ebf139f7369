"""Finding, reading and copying checkpoint weights
(upstream: vllm/model_executor/model_loader/weight_utils.py)."""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Generator

import torch
from torch import nn

from vllm.logger import init_logger

logger = init_logger(__name__)

SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copy a whole checkpoint tensor into a parameter of the same shape
    (casting to the parameter's dtype)."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        # Scalars may be stored as [] or [1].
        param.data.fill_(loaded_weight.item())
        return
    check_weight_dtype(param, loaded_weight)
    if param.size() != loaded_weight.size():
        raise ValueError(
            f"Attempted to load weight {tuple(loaded_weight.size())} into "
            f"parameter {tuple(param.size())}."
        )
    param.data.copy_(loaded_weight)


def check_weight_dtype(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Refuse a float tensor for an integer parameter (packed quantized
    weights) or the reverse: a cast would load garbage silently."""
    if param.dtype.is_floating_point != loaded_weight.dtype.is_floating_point:
        raise ValueError(
            f"Attempted to load a {loaded_weight.dtype} tensor into a {param.dtype} "
            "parameter (a quantized checkpoint with a tensor of the wrong kind?)."
        )


def get_weight_loader(param: torch.Tensor) -> Callable[..., None]:
    """The `weight_loader` a layer attached to `param` (set_weight_attrs):
    it copies this rank's part of a checkpoint tensor, given the shard id of a
    fused parameter's part. `default_weight_loader` for a parameter without one."""
    loader: Callable[..., None] = getattr(param, "weight_loader", default_weight_loader)
    return loader


def find_weight_files(model_dir: str) -> tuple[list[str], bool]:
    """The checkpoint files of a local model directory and whether they are
    safetensors (preferred) rather than PyTorch pickles."""
    if not os.path.isdir(model_dir):
        raise ValueError(f"Model path {model_dir!r} is not a local directory.")
    for pattern, use_safetensors in (
        ("*.safetensors", True),
        ("pytorch_model*.bin", False),
        ("*.pt", False),
    ):
        files = sorted(glob.glob(os.path.join(model_dir, pattern)))
        if files:
            if use_safetensors:
                files = filter_duplicate_safetensors_files(files, model_dir)
            return files, use_safetensors
    raise RuntimeError(
        f"Cannot find any model weights (*.safetensors, pytorch_model*.bin) in {model_dir!r}."
    )


def filter_duplicate_safetensors_files(hf_weights_files: list[str], model_dir: str) -> list[str]:
    """When an index file exists, keep only the shards it names (some repos also
    ship a consolidated copy that would load every weight twice)."""
    index_file = os.path.join(model_dir, SAFE_WEIGHTS_INDEX_NAME)
    if not os.path.isfile(index_file):
        return hf_weights_files
    with open(index_file) as f:
        weight_map = json.load(f)["weight_map"]
    wanted = {os.path.join(model_dir, name) for name in weight_map.values()}
    return [f for f in hf_weights_files if f in wanted]


def safetensors_weights_iterator(
    hf_weights_files: list[str],
    skip: Callable[[str], bool] | None = None,
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """(name, tensor) for every tensor of the given safetensors files; the
    names `skip` accepts are not read at all (another expert-parallel rank's
    experts)."""
    from safetensors import safe_open

    for st_file in hf_weights_files:
        try:
            handle = safe_open(st_file, framework="pt")
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(
                f"Cannot read checkpoint file {st_file!r} (corrupt or truncated?): {e}"
            ) from e
        with handle as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                if skip is None or not skip(name):
                    yield name, f.get_tensor(name)


def pt_weights_iterator(
    hf_weights_files: list[str],
) -> Generator[tuple[str, torch.Tensor], None, None]:
    """(name, tensor) from PyTorch checkpoints, loaded without unpickling code."""
    for bin_file in hf_weights_files:
        state = torch.load(bin_file, map_location="cpu", weights_only=True)
        yield from state.items()
        del state


def initialize_dummy_weights(
    model: nn.Module, low: float = -1e-3, high: float = 1e-3, seed: int = 1234
) -> None:
    """Fill every floating-point parameter with uniform noise in [low, high):
    weights for measuring speed/memory, not for meaningful output."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for param in model.state_dict().values():
        if not torch.is_floating_point(param):
            continue
        noise = torch.rand(param.shape, generator=gen, dtype=torch.float32)
        param.data.copy_((noise * (high - low) + low).to(param.dtype))
