"""Helpers shared by the KV cache tests: tiny configs and real Requests."""

from collections.abc import Callable
from typing import Any

import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request


def make_request(
    request_id: str,
    prompt_token_ids: list[int],
    block_size: int,
    hash_fn: Callable[[Any], bytes],
    prompt_logprobs: int | None = None,
    cache_salt: str | None = None,
    prompt_embeds: torch.Tensor | None = None,
) -> Request:
    """A real Request whose block hashes use ``block_size`` and ``hash_fn``."""
    sampling_params = SamplingParams(max_tokens=17, prompt_logprobs=prompt_logprobs)
    sampling_params.update_from_generation_config({}, eos_token_id=100)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt_token_ids,
        sampling_params=sampling_params,
        cache_salt=cache_salt,
        prompt_embeds=prompt_embeds,
        block_hasher=get_request_block_hasher(block_size, hash_fn),
    )


def make_kv_cache_config(block_size: int, num_blocks: int) -> KVCacheConfig:
    """One full-attention layer, fp32, one head of size 1."""
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )


def make_sliding_window_kv_cache_config(
    block_size: int, num_blocks: int, sliding_window: int
) -> KVCacheConfig:
    """One sliding-window layer, fp32, one head of size 1."""
    spec = SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype=torch.float32,
        sliding_window=sliding_window,
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )


def free_block_ids(manager_or_pool: Any) -> list[int]:
    """Ids of the free blocks, front (evicted first) to back."""
    pool = getattr(manager_or_pool, "block_pool", manager_or_pool)
    return [block.block_id for block in pool.free_block_queue.get_all_free_blocks()]
