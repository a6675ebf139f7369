"""KV cache set-up for the model runner: collect the layers' specs, build the
attention metadata builders, allocate the tensors and bind them to the layers
(upstream: the `initialize_kv_cache` helpers of gpu_model_runner.py).

Memory layout. The KV cache manager hands out block ids; a `KVCacheTensor` is
one raw byte allocation shared by the layers in its `shared_by`. Each layer
views its allocation as `backend.get_kv_cache_shape(num_blocks, ...)`, e.g.
`(2, num_blocks, block_size, num_kv_heads, head_size)` for the CPU backend,
so block id b of every layer of a group addresses the same tokens.

Encoder-only layers (`EncoderOnlyAttention`) have no spec in the scheduler's
config; the runner appends one cache-less `EncoderOnlyAttentionSpec` group for
them (`add_encoder_only_layers_to_kv_cache_config`) so that their metadata
builder exists. Such a group gets no tensor and no block table.
"""

from __future__ import annotations

import dataclasses
import mmap
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.mamba1_attn import view_mamba_states
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    EncoderOnlyAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.worker.utils import (
    AttentionGroup,
    LayerKVCache,
    bind_kv_cache,
    get_layers_from_vllm_config,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import AttentionBackend
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

logger = init_logger(__name__)


def get_kv_cache_spec(vllm_config: VllmConfig) -> dict[str, KVCacheSpec]:
    """layer name -> KV cache spec, for every layer that needs a KV cache."""
    specs: dict[str, KVCacheSpec] = {}
    for layer_name, layer in get_layers_from_vllm_config(vllm_config).items():
        spec = layer.get_kv_cache_spec(vllm_config)
        if spec is not None:
            specs[layer_name] = spec
    return specs


def add_encoder_only_layers_to_kv_cache_config(
    kv_cache_config: KVCacheConfig, vllm_config: VllmConfig
) -> KVCacheConfig:
    """The runner's copy of `kv_cache_config` with one more group, an
    `EncoderOnlyAttentionSpec` over every encoder-only attention layer (none
    added when there is no such layer). The scheduler's config is left as it
    is: it never allocates blocks for these layers."""
    block_size = vllm_config.cache_config.block_size
    specs: dict[EncoderOnlyAttentionSpec, list[str]] = defaultdict(list)
    for layer_name, layer in get_layers_from_vllm_config(vllm_config).items():
        if getattr(layer, "attn_type", None) != AttentionType.ENCODER_ONLY:
            continue
        spec = EncoderOnlyAttentionSpec(
            block_size=block_size,
            num_kv_heads=layer.num_kv_heads,
            head_size=layer.head_size,
            dtype=layer.kv_cache_torch_dtype,
        )
        specs[spec].append(layer_name)
    if not specs:
        return kv_cache_config
    if len(specs) > 1:
        raise NotImplementedError(
            "Encoder-only attention layers of different shapes in one model are not "
            f"supported (found {len(specs)} distinct head layouts)."
        )
    spec, layer_names = specs.popitem()
    groups = [*kv_cache_config.kv_cache_groups, KVCacheGroupSpec(layer_names, spec)]
    return dataclasses.replace(kv_cache_config, kv_cache_groups=groups)


def is_cacheless_group(spec: KVCacheSpec) -> bool:
    """A group that owns no KV cache tensor and no block table."""
    return isinstance(spec, EncoderOnlyAttentionSpec)


def make_attn_groups(
    kv_cache_config: KVCacheConfig, vllm_config: VllmConfig, device: torch.device
) -> list[list[AttentionGroup]]:
    """Per KV cache group, its layers split by attention backend, each with a
    metadata builder."""
    attn_groups: list[list[AttentionGroup]] = []
    for group_spec in kv_cache_config.kv_cache_groups:
        layers = get_layers_from_vllm_config(vllm_config, group_spec.layer_names)
        by_backend: dict[type[AttentionBackend], list[str]] = defaultdict(list)
        for layer_name, layer in layers.items():
            by_backend[layer.get_attn_backend()].append(layer_name)
        groups = []
        for backend, layer_names in by_backend.items():
            # A Mamba group's spec is a MambaSpec: the builder base's (upstream's)
            # AttentionSpec annotation is narrower than what builders receive.
            builder = backend.get_builder_cls()(
                group_spec.kv_cache_spec,  # type: ignore[arg-type]
                layer_names,
                vllm_config,
                device,
            )
            groups.append(AttentionGroup(backend, builder, layer_names, group_spec.kv_cache_spec))
        attn_groups.append(groups)
    return attn_groups


def allocate_and_bind_kv_caches(
    kv_cache_config: KVCacheConfig,
    attn_groups: list[list[AttentionGroup]],
    vllm_config: VllmConfig,
    device: torch.device,
) -> list[LayerKVCache]:
    """Allocate every `KVCacheTensor`, view it per layer in the backend's
    shape, and set `layer.kv_cache = [tensor]`. Returns the per-layer tensors
    in layer order."""
    raw = _allocate_raw_tensors(kv_cache_config, device)
    kv_caches: dict[str, LayerKVCache] = {}
    for groups in attn_groups:
        for group in groups:
            spec = group.kv_cache_spec
            if is_cacheless_group(spec):  # encoder-only: nothing to bind
                continue
            if isinstance(spec, MambaSpec):  # state slots, shaped by the spec
                for layer_name in group.layer_names:
                    kv_caches[layer_name] = view_mamba_states(
                        raw[layer_name], spec.shapes, spec.dtypes, kv_cache_config.num_blocks
                    )
                continue
            if not isinstance(spec, AttentionSpec):
                raise NotImplementedError(
                    f"KV cache spec {type(spec).__name__} is not "
                    "supported by the V1 model runner yet."
                )
            for layer_name in group.layer_names:
                kv_caches[layer_name] = _view_as_kv_cache(
                    raw[layer_name],
                    spec,
                    group.backend,
                    kv_cache_config.num_blocks,
                    vllm_config.cache_config.cache_dtype,
                )
    runner_kv_caches: list[LayerKVCache] = []
    bind_kv_cache(
        kv_caches, vllm_config.compilation_config.static_forward_context, runner_kv_caches
    )
    total = sum(t.size for t in kv_cache_config.kv_cache_tensors)
    logger.info(
        "KV cache: %d blocks, %.2f GiB in %d tensors",
        kv_cache_config.num_blocks,
        total / (1 << 30),
        len(kv_cache_config.kv_cache_tensors),
    )
    return runner_kv_caches


def _allocate_raw_tensors(
    kv_cache_config: KVCacheConfig, device: torch.device
) -> dict[str, torch.Tensor]:
    """layer name -> its raw int8 allocation. Zero-filled: a backend may read a
    never-written slot under a mask, and 0 * garbage can be NaN."""
    raw: dict[str, torch.Tensor] = {}
    for kv_tensor in kv_cache_config.kv_cache_tensors:
        tensor = (
            _zeroed_host_bytes(kv_tensor.size)
            if device.type == "cpu"
            else torch.zeros(kv_tensor.size, dtype=torch.int8, device=device)
        )
        for layer_name in kv_tensor.shared_by:
            raw[layer_name] = tensor
    layer_names = {
        name
        for g in kv_cache_config.kv_cache_groups
        if not is_cacheless_group(g.kv_cache_spec)
        for name in g.layer_names
    }
    missing = layer_names - raw.keys()
    if missing:
        raise ValueError(f"Layers {sorted(missing)} have no KV cache tensor.")
    return raw


def _zeroed_host_bytes(size: int) -> torch.Tensor:
    """`size` zero bytes in anonymous memory the kernel maps on first touch.

    Anonymous mappings read as zeros by definition, so nothing is written
    here: `torch.zeros` of the default 4 GiB CPU cache faults in and clears
    every page at start-up (seconds on 2 cores), this costs microseconds and
    pages come in as the cache fills. The tensor keeps the mapping alive."""
    if size == 0:
        return torch.empty(0, dtype=torch.int8)
    return torch.frombuffer(mmap.mmap(-1, size), dtype=torch.int8)


def _view_as_kv_cache(
    raw: torch.Tensor,
    spec: AttentionSpec,
    backend: type[AttentionBackend],
    num_blocks: int,
    cache_dtype: str,
) -> torch.Tensor:
    if raw.numel() % spec.page_size_bytes != 0:
        raise ValueError(
            f"KV cache tensor of {raw.numel()} bytes is not a whole number "
            f"of {spec.page_size_bytes}-byte pages."
        )
    tensor_blocks = raw.numel() // spec.page_size_bytes
    if tensor_blocks < num_blocks:
        raise ValueError(
            f"KV cache tensor holds {tensor_blocks} blocks, fewer than "
            f"the {num_blocks} the config asks for."
        )
    shape = backend.get_kv_cache_shape(
        tensor_blocks, spec.block_size, spec.num_kv_heads, spec.head_size, cache_dtype
    )
    return raw.view(spec.dtype).view(shape)
