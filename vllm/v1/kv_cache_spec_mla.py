"""The multi-head latent attention (MLA) spec family: the MLA spec, its
sliding-window variant and the hidden-state cache spec (upstream defines them
in vllm/v1/kv_cache_interface.py, which re-exports them from here; callers
import them from there).

An MLA layer caches one row per token, the compressed latent plus the rotary
key, so a page holds no separate V (`head_size_v` 0). DeepSeek-V4's fields
(`alignment` padding, `compress_ratio`, `model_version`) are carried as
upstream's; `compress_ratio` shrinks the rows a page stores.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from vllm.utils import cdiv
from vllm.v1.kv_cache_spec import (
    AttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)

_SpecT = TypeVar("_SpecT", bound=AttentionSpec)


def _mla_merge(cls: type[_SpecT], specs: list[KVCacheSpec], extra: tuple[str, ...]) -> _SpecT:
    assert all(isinstance(s, cls) for s in specs), (
        f"All attention layers in the same KV cache group must be {cls.__name__}."
    )
    for name in (
        "cache_dtype_str",
        "compress_ratio",
        "model_version",
        "indexes_kv_by_block_stride",
        *extra,
    ):
        assert len({getattr(s, name) for s in specs}) == 1, (
            f"All attention layers in the same KV cache group must use the same {name}."
        )
    first = specs[0]
    assert isinstance(first, cls)
    return copy.deepcopy(first)


def _apply_alignment_padding(spec: MLAAttentionSpec | SlidingWindowMLASpec) -> None:
    if spec.alignment is None:
        return
    padded = cdiv(spec.real_page_size_bytes, spec.alignment) * spec.alignment
    if padded != spec.real_page_size_bytes:
        object.__setattr__(spec, "page_size_padded", padded)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one cached row per token, the compressed
    latent plus the rotary key ([kv_lora_rank + qk_rope_head_dim], one "KV
    head"), so a page holds no separate V (`head_size_v` 0)."""

    cache_dtype_str: str | None = None
    alignment: int | None = None
    compress_ratio: int = 1
    model_version: str | None = None
    non_causal_multi_token_decode: bool = False
    head_size_v: int = 0
    merges_as_full_attention: ClassVar[bool] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _apply_alignment_padding(self)

    @property
    def storage_block_size(self) -> int:
        return self.block_size // self.compress_ratio

    @classmethod
    def merge(cls, specs: list[KVCacheSpec]) -> MLAAttentionSpec:
        return _mla_merge(cls, specs, ())


@dataclass(frozen=True, kw_only=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """Marker for hidden-state cache layers (upstream's extract_hidden_states)."""


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window attention over an MLA-format cache."""

    cache_dtype_str: str | None = None
    alignment: int | None = None
    compress_ratio: int = 1
    model_version: str | None = None
    head_size_v: int = 0

    @classmethod
    def default_uniform_type_base(cls) -> type[KVCacheSpec] | None:
        return SlidingWindowMLASpec

    def __post_init__(self) -> None:
        assert self.model_version in (None, "deepseek_v4"), (
            f"Unsupported model version: {self.model_version}"
        )
        super().__post_init__()
        _apply_alignment_padding(self)

    @property
    def storage_block_size(self) -> int:
        return self.block_size // self.compress_ratio

    @classmethod
    def merge(cls, specs: list[KVCacheSpec]) -> SlidingWindowMLASpec:
        return _mla_merge(cls, specs, ("sliding_window", "extra_retained_tokens"))
