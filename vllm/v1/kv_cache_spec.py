"""The per-layer KV cache specs (imported from `vllm.v1.kv_cache_interface`,
upstream's module for them).

A KV cache is split into blocks of `block_size` token slots. A spec says how
many bytes one block of one layer takes (its page), the most a request can
need (`max_memory_usage_bytes`, which sizes the cache) and how layers merge
into one group. The family: attention over every earlier token (full, with
sinks, R-SWA), windowed attention (sliding window, chunked local), Mamba
state, encoder-only and cross-attention layers; the MLA family builds on it in
`kv_cache_spec_mla.py`. Also here: the KV cache quantization modes.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields, replace
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, ClassVar

import torch

from vllm.utils import cdiv, get_dtype_size
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class KVQuantMode(IntEnum):
    """How a KV cache is quantized; backends dispatch on it, not on strings.
    Only NONE is built here (quantized KV cache dtypes are refused)."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5
    TURBOQUANT_K8V4 = 6
    TURBOQUANT_4BIT_NC = 7
    TURBOQUANT_K3V4_NC = 8
    TURBOQUANT_3BIT_NC = 9

    @property
    def is_per_token_head(self) -> bool:
        return self in (
            KVQuantMode.INT8_PER_TOKEN_HEAD,
            KVQuantMode.FP8_PER_TOKEN_HEAD,
            KVQuantMode.INT4_PER_TOKEN_HEAD,
        )

    @property
    def is_nvfp4(self) -> bool:
        return self == KVQuantMode.NVFP4

    @property
    def is_turboquant(self) -> bool:
        return self.name.startswith("TURBOQUANT_")


def get_kv_quant_mode(kv_cache_dtype: str) -> KVQuantMode:
    """The quant mode a `--kv-cache-dtype` string names."""
    if kv_cache_dtype in ("int4_per_token_head", "int8_per_token_head", "fp8_per_token_head"):
        return KVQuantMode[kv_cache_dtype.upper()]
    if kv_cache_dtype.startswith("nvfp4"):
        return KVQuantMode.NVFP4
    if kv_cache_dtype.startswith("turboquant_"):
        return KVQuantMode[kv_cache_dtype.upper()]
    if kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    return get_kv_quant_mode(kv_cache_dtype) != KVQuantMode.NONE


class KVCacheSpecKind(str, Enum):
    """A spec's kind by name (KV cache events report it)."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class KVCacheSpec:
    """A layer's KV cache format: block size and bytes per block."""

    block_size: int  # tokens per block

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    @property
    def storage_block_size(self) -> int:
        """Token rows one page stores (less than block_size when compressed)."""
        return self.block_size

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        """Worst-case bytes one request can need in this layer."""
        raise NotImplementedError

    def max_num_blocks_per_req(self, vllm_config: VllmConfig, max_len: int) -> int:
        """Block-table row length this layer's group needs for `max_len` tokens."""
        return cdiv(max_len, self.block_size)

    def copy_with_new_block_size(self, block_size: int) -> KVCacheSpec:
        return replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: list[KVCacheSpec]) -> KVCacheSpec:
        """Merge the specs of the layers of one group; they must agree."""
        assert all(spec == specs[0] for spec in specs[1:]), (
            "All layers in the same KV cache group must be the same."
        )
        return copy.deepcopy(specs[0])

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        """The spec type whose layers this type's layers share a KV cache
        group with, unless registered otherwise (None: layers of this type do
        not group; KVCacheSpecRegistry.get_uniform_type_base_spec)."""
        return None

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Whether every spec in `kv_cache_specs` is of this spec's type."""
        base = uniform_type_base(self)
        assert base is not None, f"Unsupported KV cache spec type: {type(self)}."
        return all(isinstance(spec, base) for spec in kv_cache_specs.values())


def uniform_type_base(spec: KVCacheSpec) -> type | None:
    """The spec type `spec`'s layers share KV cache groups with: the one
    registered for its type (KVCacheSpecRegistry), else the type's own
    default; None if its layers do not group."""
    registered = KVCacheSpecRegistry.get_uniform_type_base_spec(spec)
    return registered if registered is not None else spec.default_uniform_type_base()


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """K and V rows per token and head. A page is
    num_heads x storage_block_size x (head_size + head_size_v) elements,
    unless the backend packs it (`num_head_slots`, `state_content_bytes`) or
    pads it (`page_size_padded`)."""

    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    head_size_v: int = None  # type: ignore[assignment]  # defaults to head_size
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None
    indexes_kv_by_block_stride: bool = False
    num_head_slots: int | None = None
    state_content_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def num_heads(self) -> int:
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    @property
    def state_content_size_bytes(self) -> int:
        """Bytes per (head slot, token row) cell of the page."""
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * get_dtype_size(self.dtype)

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.num_heads * self.storage_block_size * self.state_content_size_bytes

    @property
    def real_page_size_bytes(self) -> int:
        return self.unpadded_page_size_bytes

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            assert self.page_size_padded >= self.unpadded_page_size_bytes
            return self.page_size_padded
        return self.unpadded_page_size_bytes


def _merge_window(values: set[int]) -> int | None:
    if len(values) > 1:
        raise ValueError(
            "All attention layers in the same KV cache group must have the same window size."
        )
    return values.pop() if values else None


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Attention over every earlier token. `sliding_window` /
    `attention_chunk_size` are set only when such a layer is served by a
    full-attention manager (blocks kept for all tokens, attention still
    windowed in the kernel). `non_causal`: the layer attends bidirectionally."""

    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False
    # Whether merge() below merges a group of this type; the MLA family
    # (one latent row per token) has its own rule and says False.
    merges_as_full_attention: ClassVar[bool] = True

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        return FullAttentionSpec

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        max_model_len = get_max_model_len(vllm_config)
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes

    @classmethod
    def merge_window_sizes(cls, window_sizes: set[int]) -> int | None:
        return _merge_window(window_sizes)

    @classmethod
    def merge(cls, specs: list[KVCacheSpec]) -> FullAttentionSpec:
        """One spec for a group: the attention fields must agree; windows are
        merged (at most one size); non-causal if any layer is."""
        full = [s for s in specs if isinstance(s, FullAttentionSpec)]
        assert len(full) == len(specs), (
            "All attention layers in the same KV cache group must be FullAttentionSpec."
        )
        assert all(s.merges_as_full_attention for s in full), (
            "MLAAttentionSpec should be merged in MLAAttentionSpec.merge"
        )
        windows = {s.sliding_window for s in full if s.sliding_window is not None}
        chunks = {s.attention_chunk_size for s in full if s.attention_chunk_size is not None}
        merged = replace(
            full[0],
            sliding_window=_merge_window(windows),
            attention_chunk_size=_merge_window(chunks),
            non_causal=any(s.non_causal for s in full),
        )
        for spec in specs:
            for f in fields(AttentionSpec):
                assert getattr(spec, f.name) == getattr(merged, f.name), (
                    "All attention layers in the same KV cache group must have the same "
                    "attention spec."
                )
        assert (merged.sliding_window is not None) + (
            merged.attention_chunk_size is not None
        ) <= 1, (
            "Model with both sliding window layers and chunked local attention layers "
            "is not supported."
        )
        return merged


@dataclass(frozen=True, kw_only=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with `sink_len` learned sink tokens."""

    sink_len: int | None = None


@dataclass(frozen=True, kw_only=True)
class RSWASpec(FullAttentionSpec):
    """Reference sliding-window attention: prompt tokens stay visible; only the
    last `rswa_window` generated tokens are kept."""

    rswa_window: int

    @classmethod
    def merge(cls, specs: list[KVCacheSpec]) -> RSWASpec:
        rswa = [s for s in specs if isinstance(s, RSWASpec)]
        assert len(rswa) == len(specs), (
            "All attention layers in the same KV cache group must be RSWASpec."
        )
        assert len({s.rswa_window for s in rswa}) == 1, (
            "All R-SWA layers must share the same rswa_window."
        )
        merged = super().merge(specs)
        assert isinstance(merged, RSWASpec)
        return merged


def get_max_in_flight_tokens(vllm_config: VllmConfig) -> int:
    """Most tokens scheduled but not yet processed (upstream's
    `VllmConfig.max_in_flight_tokens`): a full token budget per batch in
    flight. Windowed specs keep the blocks of those tokens until they are
    processed, so the KV cache is sized, and admission capped, with it."""
    return vllm_config.max_concurrent_batches * vllm_config.scheduler_config.max_num_batched_tokens


def get_max_model_len(vllm_config: VllmConfig) -> int:
    """The resolved max model length. KV cache sizing needs a model, and
    `ModelConfig` resolves the user's value (an int, a string like "32k", or
    None for the model's own limit) to an int when it is built."""
    model_config = vllm_config.model_config
    assert model_config is not None, "the KV cache is sized for a model"
    max_model_len = model_config.max_model_len
    assert isinstance(max_model_len, int), "ModelConfig resolves max_model_len"
    return max_model_len


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Attention within fixed chunks of `attention_chunk_size` tokens."""

    attention_chunk_size: int

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        return ChunkedLocalAttentionSpec

    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int:
        # One chunk window plus the tokens in flight (freed once processed).
        num_tokens = min(self.attention_chunk_size + max_in_flight_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size)

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        return (
            self.max_admission_blocks_per_request(
                get_max_in_flight_tokens(vllm_config), get_max_model_len(vllm_config)
            )
            * self.page_size_bytes
        )

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        return all(
            isinstance(s, ChunkedLocalAttentionSpec)
            and s.attention_chunk_size == self.attention_chunk_size
            for s in kv_cache_specs.values()
        )


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over the last `sliding_window` tokens only;
    `extra_retained_tokens` more trailing tokens keep their blocks."""

    sliding_window: int
    extra_retained_tokens: int = 0

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        return SlidingWindowSpec

    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int:
        # The window, the retained tail and the tokens in flight; +1 because the
        # window need not start at a block boundary.
        num_tokens = min(
            self.sliding_window - 1 + self.extra_retained_tokens + max_in_flight_tokens,
            max_model_len,
        )
        return cdiv(num_tokens, self.block_size) + 1

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        return (
            self.max_admission_blocks_per_request(
                get_max_in_flight_tokens(vllm_config), get_max_model_len(vllm_config)
            )
            * self.page_size_bytes
        )

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        return all(
            isinstance(s, SlidingWindowSpec) and s.sliding_window == self.sliding_window
            for s in kv_cache_specs.values()
        )


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """State-space layers: a fixed-size state per request instead of per-token
    K/V. One block is one request's state slot: `shapes[i]` / `dtypes[i]`
    describe its tensors (Mamba-1: conv state [d_inner, d_conv - 1] and SSM
    state [d_inner, d_state]); `block_size` is max_model_len, so a request
    never needs a second block. Only `mamba_cache_mode="none"` (no prefix
    caching of states) is built."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba1"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        return MambaSpec

    @property
    def page_size_bytes(self) -> int:
        size = sum(
            math.prod(shape) * get_dtype_size(dtype)
            for shape, dtype in zip(self.shapes, self.dtypes)
        )
        if self.page_size_padded is not None:
            assert self.page_size_padded >= size
            return self.page_size_padded
        return size

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        # Upstream reads the mode from CacheConfig; only "none" is built here
        # (MambaManager refuses the others), so the spec's own field decides.
        mode = self.mamba_cache_mode
        if mode == "all":
            max_model_len = get_max_model_len(vllm_config)
            return (
                cdiv(max_model_len, self.block_size) + self.num_speculative_blocks
            ) * self.page_size_bytes
        slots = 2 if mode == "align" else 1
        return (slots + self.num_speculative_blocks) * self.page_size_bytes

    def max_num_blocks_per_req(self, vllm_config: VllmConfig, max_len: int) -> int:
        return cdiv(self.max_memory_usage_bytes(vllm_config), self.page_size_bytes)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        return all(
            isinstance(s, MambaSpec) and s.num_speculative_blocks == self.num_speculative_blocks
            for s in kv_cache_specs.values()
        )


@dataclass(frozen=True, kw_only=True)
class EncoderOnlyAttentionSpec(AttentionSpec):
    """Encoder-only layers: no KV cache is kept."""

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        return 0


@dataclass(frozen=True, kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """Cross-attention of encoder-decoder models: caches the encoder states."""

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        return CrossAttentionSpec

    def max_memory_usage_bytes(self, vllm_config: VllmConfig) -> int:
        max_encoder_len = getattr(vllm_config.scheduler_config, "max_num_encoder_input_tokens", 0)
        return cdiv(max_encoder_len, self.block_size) * self.page_size_bytes
