"""What the KV cache of each layer looks like (upstream: vllm/v1/kv_cache_interface.py).

A KV cache is split into blocks of `block_size` token slots. A spec says how
many bytes one block of one layer takes (its page) and how blocks are managed
(full attention keeps every block; a sliding window can drop old ones).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from vllm.utils import cdiv, get_dtype_size

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class KVCacheSpec:
    """A layer's KV cache format: block size and bytes per block."""

    block_size: int  # tokens per block

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    def max_memory_usage_bytes(self, vllm_config: "VllmConfig") -> int:
        """Worst-case bytes one request can need in this layer."""
        raise NotImplementedError

    @classmethod
    def merge(cls, specs: list["KVCacheSpec"]) -> "KVCacheSpec":
        """Merge the specs of the layers of one group; they must agree."""
        assert all(spec == specs[0] for spec in specs[1:]), (
            "All layers in the same KV cache group must have the same spec.")
        return copy.deepcopy(specs[0])


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def page_size_bytes(self) -> int:
        # K and V: 2 * block_size * num_kv_heads * head_size elements.
        return 2 * self.block_size * self.num_kv_heads * self.head_size * get_dtype_size(
            self.dtype)


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    """Attention over every earlier token. `sliding_window` is set only when a
    sliding-window layer is served by a full-attention manager."""

    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def max_memory_usage_bytes(self, vllm_config: "VllmConfig") -> int:
        max_model_len = vllm_config.model_config.max_model_len
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one cached row per token, the compressed
    latent plus the rotary key ([kv_lora_rank + qk_rope_head_dim], one "KV
    head"), so a page holds no separate K and V."""

    cache_dtype_str: str | None = None

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.num_kv_heads * self.head_size * get_dtype_size(
            self.dtype)


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over the last `sliding_window` tokens only."""

    sliding_window: int

    def max_memory_usage_bytes(self, vllm_config: "VllmConfig") -> int:
        max_model_len = vllm_config.model_config.max_model_len
        max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        # The window, plus one step of new tokens, plus one partially used block.
        num_tokens = min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)
        return (cdiv(num_tokens, self.block_size) + 1) * self.page_size_bytes


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """State-space layers: a fixed-size state per request instead of per-token
    K/V. One block is one request's state slot: `shapes[i]` / `dtypes[i]`
    describe its tensors (Mamba-1: conv state [d_inner, d_conv - 1] and SSM
    state [d_inner, d_state]); `block_size` is max_model_len, so a request
    never needs a second block."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    mamba_type: str = "mamba1"

    @property
    def page_size_bytes(self) -> int:
        return sum(math.prod(shape) * get_dtype_size(dtype)
                   for shape, dtype in zip(self.shapes, self.dtypes))

    def max_memory_usage_bytes(self, vllm_config: "VllmConfig") -> int:
        return self.page_size_bytes  # one state slot, whatever the length


@dataclass
class KVCacheTensor:
    """One allocation; `shared_by` lists the layers that use it."""

    size: int  # bytes
    shared_by: list[str]


@dataclass
class KVCacheGroupSpec:
    """Layers that share one block table (same spec, same block ids)."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    """The KV cache of one worker: how many blocks, the tensors, the groups."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]
