"""Small helpers shared by both model runners (upstream: vllm/v1/worker/utils.py
and the `CpuGpuBuffer` of vllm/v1/utils.py). This module imports neither runner
(.importlinter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast, runtime_checkable

import numpy as np
import torch
import torch.nn as nn

from vllm.distributed import get_pp_group

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.model import ModelConfig
    from vllm.sequence import IntermediateTensors
    from vllm.v1.attention.backend import (
        AttentionBackend,
        AttentionMetadataBuilder,
        CommonAttentionMetadata,
    )
    from vllm.v1.kv_cache_interface import KVCacheSpec


class CpuGpuBuffer:
    """A host tensor, its numpy view and a device twin.

    The runner prepares inputs in numpy (cheap, vectorised) and copies the used
    prefix to the device. On a CPU device the twin *is* the host tensor, so
    `copy_to_gpu` costs nothing and the model reads the numpy-written memory.
    """

    def __init__(
        self,
        *size: int,
        dtype: torch.dtype,
        device: torch.device,
        pin_memory: bool,
        with_numpy: bool = True,
    ) -> None:
        self.cpu = torch.zeros(*size, dtype=dtype, device="cpu", pin_memory=pin_memory)
        self.np: np.ndarray = self.cpu.numpy() if with_numpy else np.empty(0)
        self.on_cpu = device.type == "cpu"
        self.gpu = self.cpu if self.on_cpu else torch.zeros_like(self.cpu, device=device)

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        """Copy the first `n` rows (all when None) to the device; returns that slice."""
        if n is None:
            if not self.on_cpu:
                self.gpu.copy_(self.cpu, non_blocking=True)
            return self.gpu
        if not self.on_cpu:
            self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


def build_group_attn_metadata(
    groups: list[AttentionGroup],
    common: CommonAttentionMetadata,
    for_cudagraph_capture: bool,
    out: dict[str, Any],
) -> None:
    """One KV cache group's metadata: each backend group's builder builds it
    once from `common` and every layer of that group shares it (out[layer])."""
    for group in groups:
        builder = group.metadata_builder
        metadata = (
            builder.build_for_cudagraph_capture(common)
            if for_cudagraph_capture
            else builder.build(common_prefix_len=0, common_attn_metadata=common)
        )
        for layer_name in group.layer_names:
            out[layer_name] = metadata


def get_layers_from_vllm_config(
    vllm_config: VllmConfig, layer_names: list[str] | None = None
) -> dict[str, Any]:
    """The attention layers registered in the static forward context, by name
    (all of them when `layer_names` is None)."""
    ctx = vllm_config.compilation_config.static_forward_context
    if layer_names is None:
        return dict(ctx)
    missing = [name for name in layer_names if name not in ctx]
    if missing:
        raise ValueError(
            f"Layers {missing} are not registered in the static forward "
            "context; was the model built under this VllmConfig?"
        )
    return {name: ctx[name] for name in layer_names}


# One layer's KV cache: a tensor for attention, the state tensors for Mamba.
LayerKVCache: TypeAlias = "torch.Tensor | tuple[torch.Tensor, ...]"


def bind_kv_cache(
    kv_caches: dict[str, LayerKVCache],
    forward_context: dict[str, Any],
    runner_kv_caches: list[LayerKVCache],
) -> None:
    """Give every attention layer its KV cache tensor.

    Layers read `layer.kv_cache[virtual_engine]`; without pipeline parallelism
    there is one virtual engine. `runner_kv_caches` receives the tensors in
    layer order so the runner can reach them directly.
    """
    runner_kv_caches.clear()
    for layer_name in sorted(kv_caches, key=_layer_sort_key):
        runner_kv_caches.append(kv_caches[layer_name])
    for layer_name, kv_cache in kv_caches.items():
        forward_context[layer_name].kv_cache = [kv_cache]


def _layer_sort_key(layer_name: str) -> tuple:
    """Order "model.layers.10.attn" after "model.layers.9.attn"."""
    return tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in layer_name.split(".")
    )


@dataclass
class AttentionGroup:
    """Layers of one KV cache group that share a backend, and hence one
    metadata builder (upstream: vllm/v1/worker/utils.py)."""

    backend: type[AttentionBackend]
    metadata_builder: AttentionMetadataBuilder
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


class SwappableBatch(Protocol):
    """What `reorder_batch_to_split_decodes_and_prefills` needs of a batch (the
    V1 runner's `InputBatch`): its rows' request ids and a row swap. A protocol,
    so that this module, shared by both runners, imports neither."""

    @property
    def req_ids(self) -> list[str]: ...

    def swap_states(self, i1: int, i2: int) -> None: ...


def reorder_batch_to_split_decodes_and_prefills(
    input_batch: SwappableBatch,
    num_scheduled_tokens: dict[str, int],
    decode_threshold: int = 1,
) -> bool:
    """Order the persistent batch so every request with at most
    `decode_threshold` scheduled tokens comes before every other one.

    Swaps the first misplaced prefill with the last misplaced decode until the
    two classes are separated: at most min(#decodes, #prefills) swaps, and none
    once the batch is already split (the steady decode state).
    Returns whether the batch changed.
    """
    req_ids = input_batch.req_ids
    num_reqs = len(req_ids)
    if num_reqs == 0:
        return False
    counts = np.fromiter((num_scheduled_tokens[r] for r in req_ids), dtype=np.int64, count=num_reqs)
    is_decode = counts <= decode_threshold
    num_decodes = int(is_decode.sum())
    # Rows that must move: prefills in the front part, decodes in the back part.
    prefills_in_front = np.flatnonzero(~is_decode[:num_decodes])
    decodes_in_back = np.flatnonzero(is_decode[num_decodes:])[::-1] + num_decodes
    for prefill_row, decode_row in zip(prefills_in_front.tolist(), decodes_in_back.tolist()):
        input_batch.swap_states(prefill_row, decode_row)
    return len(prefills_in_front) > 0


def get_model_config(vllm_config: VllmConfig) -> ModelConfig:
    """The model config a runner runs (a VllmConfig may have none)."""
    if vllm_config.model_config is None:
        raise ValueError("A model runner needs a model_config.")
    return vllm_config.model_config


def resolved_dtype(model_config: ModelConfig) -> torch.dtype:
    """`dtype` is typed for what users pass ("auto", "bfloat16"); the config's
    __post_init__ resolves it to a torch dtype."""
    value = model_config.dtype
    assert isinstance(value, torch.dtype), f"unresolved dtype {value!r}"
    return value


class TextGenerationModel(Protocol):
    """The model as both runners call it (upstream:
    `VllmModelForTextGeneration` of vllm/model_executor/models/interfaces_base.py):
    a forward over flattened tokens, then logits for the rows to sample."""

    def __call__(
        self,
        *,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> Any: ...

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor: ...


def as_text_generation_model(model: nn.Module) -> TextGenerationModel:
    """The loaded model, as the runners call it. The loader types what it
    builds as a plain `nn.Module`; every model class here defines
    `forward(input_ids, positions, intermediate_tensors)` and `compute_logits`."""
    if not callable(getattr(model, "compute_logits", None)):
        raise TypeError(f"{type(model).__name__} has no compute_logits: not a generative model.")
    return cast("TextGenerationModel", model)


@runtime_checkable
class _SupportsPPModel(Protocol):
    def make_empty_intermediate_tensors(
        self, batch_size: int, dtype: torch.dtype, device: torch.device
    ) -> IntermediateTensors: ...


def pp_dummy_intermediate_tensors(
    model: object, num_tokens: int, dtype: torch.dtype, device: torch.device
) -> IntermediateTensors | None:
    """What a dummy batch's forward starts from: None on the first stage, zeros
    (the model's `make_empty_intermediate_tensors`) on a later one, since the
    stages run their dummy batches independently."""
    if get_pp_group().is_first_rank:
        return None
    assert isinstance(model, _SupportsPPModel), "a later pipeline stage needs a PP model"
    return model.make_empty_intermediate_tensors(num_tokens, dtype, device)
