"""KV-cache planning: how many blocks fit and how the tensors are laid out.

Runs once in the engine core at start-up, between profiling the workers'
free memory and allocating their KV caches:

    specs (per worker: layer name -> KVCacheSpec) + free bytes (per worker)
        -> check_enough_kv_cache_memory   (one max_model_len request must fit)
        -> get_kv_cache_groups            (layers sharing one block table)
        -> KVCacheConfig per worker       (num_blocks, one tensor per layer)
        -> num_blocks = min over workers  (one scheduler drives them all)

Models whose layers all share one KV cache type get one group. Sliding-window
layers next to full-attention layers are served as full attention (upstream's
behaviour with the hybrid KV cache manager disabled). Attention layers next to
state-space layers (hybrid models such as Qwen3.5) get two groups, one per
kind, over shared block ids. Other mixes raise NotImplementedError.
"""

import copy
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.utils import GiB_bytes, cdiv
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    get_max_model_len,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)


def max_memory_usage_bytes(vllm_config: "VllmConfig", kv_cache_specs: Iterable[KVCacheSpec]) -> int:
    """Bytes one request of max_model_len tokens needs over all layers."""
    return sum(spec.max_memory_usage_bytes(vllm_config) for spec in kv_cache_specs)


def estimate_max_model_len(
    vllm_config: "VllmConfig",
    kv_cache_spec: dict[str, KVCacheSpec],
    available_memory: int,
) -> int:
    """The largest max_model_len whose request fits in ``available_memory``.

    Binary search over [1, current max_model_len]; 0 if not even one token
    fits. max_model_len is changed during the search and restored after.
    """
    model_config = vllm_config.model_config
    assert model_config is not None, "the KV cache is sized for a model"
    original_max_model_len = get_max_model_len(vllm_config)

    def fits(model_len: int) -> bool:
        model_config.max_model_len = model_len
        return max_memory_usage_bytes(vllm_config, kv_cache_spec.values()) <= available_memory

    try:
        best, low, high = 0, 1, original_max_model_len
        while low <= high:
            mid = (low + high) // 2
            if fits(mid):
                best, low = mid, mid + 1
            else:
                high = mid - 1
        return best
    finally:
        model_config.max_model_len = original_max_model_len


def check_enough_kv_cache_memory(
    vllm_config: "VllmConfig",
    kv_cache_spec: dict[str, KVCacheSpec],
    available_memory: int,
) -> None:
    """Raise ValueError unless one request of max_model_len tokens fits.

    Models without KV cache (``kv_cache_spec`` empty) need no memory.
    """
    if not kv_cache_spec:
        return
    if available_memory <= 0:
        raise ValueError(
            "No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization` when initializing the engine."
        )
    max_model_len = get_max_model_len(vllm_config)
    needed_memory = max_memory_usage_bytes(vllm_config, kv_cache_spec.values())
    if needed_memory <= available_memory:
        return
    estimated = estimate_max_model_len(vllm_config, kv_cache_spec, available_memory)
    raise ValueError(
        f"The model's max seq len ({max_model_len}) is larger than the maximum "
        f"number of tokens that can be stored in KV cache ({estimated}). "
        f"({needed_memory / GiB_bytes:.2f} GiB KV cache is needed, but only "
        f"{available_memory / GiB_bytes:.2f} GiB is available.) Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."
    )


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict[str, KVCacheSpec]) -> None:
    """Serve sliding-window layers as full attention when both kinds exist.

    In place: each SlidingWindowSpec next to a FullAttentionSpec becomes a
    FullAttentionSpec that remembers its window. Its blocks are then never
    freed early, which costs memory but keeps one block table for all layers.
    """
    specs = kv_cache_spec.values()
    has_full = any(isinstance(spec, FullAttentionSpec) for spec in specs)
    has_sliding = any(isinstance(spec, SlidingWindowSpec) for spec in specs)
    if not (has_full and has_sliding):
        return
    for layer_name, spec in kv_cache_spec.items():
        if isinstance(spec, SlidingWindowSpec):
            kv_cache_spec[layer_name] = FullAttentionSpec(
                block_size=spec.block_size,
                num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size,
                dtype=spec.dtype,
                sliding_window=spec.sliding_window,
            )


def _without_window(spec: KVCacheSpec) -> KVCacheSpec:
    # A full-attention layer's window only matters to its attention kernel;
    # layers that differ only there can share one block table.
    if isinstance(spec, FullAttentionSpec):
        return replace(spec, sliding_window=None, attention_chunk_size=None)
    return spec


def is_kv_cache_spec_uniform(kv_cache_spec: dict[str, KVCacheSpec]) -> bool:
    """Whether all layers can share one KV cache group (one block table)."""
    if not kv_cache_spec:
        return False
    specs = [_without_window(spec) for spec in kv_cache_spec.values()]
    return all(spec == specs[0] for spec in specs[1:])


def _merge_group_spec(layer_specs: list[KVCacheSpec]) -> KVCacheSpec:
    """The spec of a group: the layers' common spec (the window, if all
    full-attention layers of the group share one, is kept)."""
    first = layer_specs[0]
    if not isinstance(first, FullAttentionSpec):
        return first.merge(layer_specs)
    windows = {
        spec.sliding_window for spec in layer_specs if isinstance(spec, FullAttentionSpec)
    } - {None}
    window = windows.pop() if len(windows) == 1 else None
    return replace(copy.deepcopy(first), sliding_window=window, attention_chunk_size=None)


def get_kv_cache_groups(
    vllm_config: "VllmConfig", kv_cache_spec: dict[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Split the layers into KV cache groups: one group, or none at all for
    attention-free models. ``kv_cache_spec`` may be modified in place."""
    if not kv_cache_spec:
        return []
    unify_hybrid_kv_cache_specs(kv_cache_spec)
    if not is_kv_cache_spec_uniform(kv_cache_spec) and _is_attention_and_mamba(kv_cache_spec):
        return _attention_and_mamba_groups(kv_cache_spec)
    if not is_kv_cache_spec_uniform(kv_cache_spec):
        kinds = sorted({type(spec).__name__ for spec in kv_cache_spec.values()})
        raise NotImplementedError(
            f"Models mixing KV cache types {kinds} need the hybrid KV cache "
            "manager, which is not supported."
        )
    layer_names = list(kv_cache_spec)
    group_spec = _merge_group_spec([kv_cache_spec[name] for name in layer_names])
    return [KVCacheGroupSpec(layer_names, group_spec)]


def _is_attention_and_mamba(kv_cache_spec: dict[str, KVCacheSpec]) -> bool:
    """Hybrid models (e.g. Qwen3.5): uniform attention layers plus uniform
    state-space layers."""
    attention = {name: s for name, s in kv_cache_spec.items() if not isinstance(s, MambaSpec)}
    mamba = [s for s in kv_cache_spec.values() if isinstance(s, MambaSpec)]
    return (
        bool(attention)
        and bool(mamba)
        and is_kv_cache_spec_uniform(attention)
        and all(s == mamba[0] for s in mamba[1:])
    )


def _attention_and_mamba_groups(kv_cache_spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Two KV cache groups, each with its own block table: the attention
    layers (paged K/V) and the state-space layers (one state slot per request)."""
    attention = [n for n, s in kv_cache_spec.items() if not isinstance(s, MambaSpec)]
    mamba = [n for n, s in kv_cache_spec.items() if isinstance(s, MambaSpec)]
    return [
        KVCacheGroupSpec(attention, _merge_group_spec([kv_cache_spec[n] for n in attention])),
        KVCacheGroupSpec(mamba, kv_cache_spec[mamba[0]]),
    ]


def _kv_cache_config_for_several_groups(
    vllm_config: "VllmConfig", kv_cache_groups: list[KVCacheGroupSpec], available_memory: int
) -> KVCacheConfig:
    """Several groups drawing block ids from one pool: any block id may be
    handed to any group, so every layer gets a tensor of num_blocks pages of
    its own spec (simple, at the cost of memory a page-size-unified layout
    would share)."""
    bytes_per_block = sum(
        group.kv_cache_spec.page_size_bytes * len(group.layer_names) for group in kv_cache_groups
    )
    num_blocks = may_override_num_blocks(
        vllm_config, max(int(available_memory // bytes_per_block), 0)
    )
    kv_cache_tensors = [
        KVCacheTensor(size=group.kv_cache_spec.page_size_bytes * num_blocks, shared_by=[layer_name])
        for group in kv_cache_groups
        for layer_name in group.layer_names
    ]
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=kv_cache_tensors, kv_cache_groups=kv_cache_groups
    )


def may_override_num_blocks(vllm_config: "VllmConfig", num_blocks: int) -> int:
    """``cache_config.num_gpu_blocks_override`` if set, else ``num_blocks``."""
    override = vllm_config.cache_config.num_gpu_blocks_override
    if override is None:
        return num_blocks
    logger.info(
        "Overriding num_gpu_blocks=%d with num_gpu_blocks_override=%d", num_blocks, override
    )
    return override


def get_num_blocks(
    vllm_config: "VllmConfig", num_layers: int, available_memory: int, page_size: int
) -> int:
    """Blocks that fit when every layer holds one page per block."""
    num_blocks = max(int(available_memory // page_size // num_layers), 0)
    return may_override_num_blocks(vllm_config, num_blocks)


def get_kv_cache_config_from_groups(
    vllm_config: "VllmConfig",
    kv_cache_groups: list[KVCacheGroupSpec],
    available_memory: int,
) -> KVCacheConfig:
    """One worker's KVCacheConfig: memory split evenly over its layers.

    Every layer gets its own tensor of ``page_size * num_blocks`` bytes; block
    ``i`` of every layer holds the same tokens.
    """
    if not kv_cache_groups:
        # Attention-free model: one dummy block keeps the block pool valid.
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])
    if len(kv_cache_groups) > 1:
        return _kv_cache_config_for_several_groups(vllm_config, kv_cache_groups, available_memory)
    group = kv_cache_groups[0]
    page_size = group.kv_cache_spec.page_size_bytes
    num_blocks = get_num_blocks(vllm_config, len(group.layer_names), available_memory, page_size)
    kv_cache_tensors = [
        KVCacheTensor(size=page_size * num_blocks, shared_by=[layer_name])
        for layer_name in group.layer_names
    ]
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=kv_cache_tensors,
        kv_cache_groups=kv_cache_groups,
    )


def get_max_concurrency_for_kv_cache_config(
    vllm_config: "VllmConfig", kv_cache_config: KVCacheConfig
) -> float:
    """How many requests of max_model_len tokens the cache can hold at once."""
    num_blocks_per_request = sum(
        cdiv(
            group.kv_cache_spec.max_memory_usage_bytes(vllm_config),
            group.kv_cache_spec.page_size_bytes,
        )
        for group in kv_cache_config.kv_cache_groups
    )
    if num_blocks_per_request == 0:
        return 0.0
    return kv_cache_config.num_blocks / num_blocks_per_request


def get_kv_cache_capacity(
    vllm_config: "VllmConfig", kv_cache_config: KVCacheConfig
) -> tuple[int, float]:
    """(tokens the cache holds counted in max_model_len requests, max concurrency)."""
    max_concurrency = get_max_concurrency_for_kv_cache_config(vllm_config, kv_cache_config)
    return int(max_concurrency * get_max_model_len(vllm_config)), max_concurrency


def group_and_unify_kv_cache_specs(
    kv_cache_spec: dict[str, KVCacheSpec],
) -> list[UniformTypeKVCacheSpecs] | None:
    """Upstream packs sliding-window MLA layers of different page sizes into
    tuples of layers (DeepSeek-V4). None when no such packing is needed; the
    packing itself is not built and is refused."""
    if not any(isinstance(spec, SlidingWindowMLASpec) for spec in kv_cache_spec.values()):
        return None
    if len({spec.page_size_bytes for spec in kv_cache_spec.values()}) <= 1:
        return None
    raise NotImplementedError(
        "Sliding-window MLA layers with mixed page sizes "
        "(DeepSeek-V4 KV cache packing) are not supported."
    )


def _report_kv_cache_config(vllm_config: "VllmConfig", config: KVCacheConfig) -> None:
    if not config.kv_cache_groups:
        return
    block_size = config.kv_cache_groups[0].kv_cache_spec.block_size
    max_concurrency = get_max_concurrency_for_kv_cache_config(vllm_config, config)
    logger.info("GPU KV cache size: %s tokens", f"{config.num_blocks * block_size:,}")
    logger.info(
        "Maximum concurrency for %s tokens per request: %.2fx",
        f"{get_max_model_len(vllm_config):,}",
        max_concurrency,
    )


def get_kv_cache_configs(
    vllm_config: "VllmConfig",
    kv_cache_specs: list[dict[str, KVCacheSpec]],
    available_memory: list[int],
) -> list[KVCacheConfig]:
    """Plan the KV cache of every worker.

    Args:
        vllm_config: The global config.
        kv_cache_specs: Per worker, the KV cache spec of each of its layers.
        available_memory: Per worker, the bytes free for its KV cache.

    Returns:
        One KVCacheConfig per worker, all with the same (smallest) num_blocks,
        because one scheduler hands out the same block ids to every worker.
    """
    if len(kv_cache_specs) != len(available_memory):
        raise ValueError("Need one available-memory figure per worker spec.")
    for spec_one_worker, memory_one_worker in zip(kv_cache_specs, available_memory):
        check_enough_kv_cache_memory(vllm_config, spec_one_worker, memory_one_worker)

    # Group the union of all workers' layers, so every worker agrees on groups.
    merged_specs: dict[str, KVCacheSpec] = {}
    for spec_one_worker in kv_cache_specs:
        for layer_name, layer_spec in spec_one_worker.items():
            if merged_specs.setdefault(layer_name, layer_spec) != layer_spec:
                raise ValueError(f"Workers disagree on the KV cache spec of {layer_name}.")
    global_groups = get_kv_cache_groups(vllm_config, merged_specs)

    kv_cache_configs = []
    for spec_one_worker, memory_one_worker in zip(kv_cache_specs, available_memory):
        groups_one_worker = [
            KVCacheGroupSpec(
                [name for name in group.layer_names if name in spec_one_worker],
                group.kv_cache_spec,
            )
            for group in global_groups
        ]
        kv_cache_configs.append(
            get_kv_cache_config_from_groups(vllm_config, groups_one_worker, memory_one_worker)
        )

    # One scheduler hands out one set of block ids: every worker gets the
    # smallest count, and a worker with more memory shrinks its tensors to
    # match, since it allocates them by size and would never use the rest.
    min_num_blocks = min(config.num_blocks for config in kv_cache_configs)
    for config in kv_cache_configs:
        old_num_blocks, config.num_blocks = config.num_blocks, min_num_blocks
        for tensor in config.kv_cache_tensors if old_num_blocks else ():
            assert tensor.size % old_num_blocks == 0, "a tensor is whole blocks"
            tensor.size = tensor.size // old_num_blocks * min_num_blocks
    _report_kv_cache_config(vllm_config, kv_cache_configs[0])
    return kv_cache_configs


def generate_scheduler_kv_cache_config(
    kv_cache_configs: list[KVCacheConfig],
) -> KVCacheConfig:
    """The KVCacheConfig the scheduler uses: all workers' configs agree except
    for layer names, so a copy of the first one, where a group of several
    specs of one type (`UniformTypeKVCacheSpecs`) is represented by one of them
    (they need the same token slots; the scheduler never looks at bytes)."""
    assert all(cfg.num_blocks == kv_cache_configs[0].num_blocks for cfg in kv_cache_configs)
    config = copy.deepcopy(kv_cache_configs[0])
    for group in config.kv_cache_groups:
        if isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs):
            group.kv_cache_spec = next(iter(group.kv_cache_spec.kv_cache_specs.values()))
    return config
