"""Managers for KV cache spec kinds that are not built yet.

Upstream serves these specs with their own managers (cross-attention of
encoder-decoder models, reference sliding-window attention). The spec records
exist (`vllm.v1.kv_cache_interface`) so that models and tests can describe such
layers; building a KV cache manager for one is refused here, by name, rather
than serving the layer with the wrong block rules.
Imported from `vllm.v1.core.single_type_kv_cache_manager`, upstream's module
for them.
"""

from typing import Unpack

from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager_base import (
    CacheHitSearch,
    ManagerArgs,
    SingleTypeKVCacheManager,
)
from vllm.v1.kv_cache_interface import KVCacheSpec


class _UnbuiltManager(SingleTypeKVCacheManager):
    feature = ""

    def __init__(self, kv_cache_spec: KVCacheSpec, **kwargs: Unpack[ManagerArgs]) -> None:
        raise NotImplementedError(
            f"{type(kv_cache_spec).__name__}: {self.feature} is not built yet, so no KV "
            "cache manager serves it."
        )

    @classmethod
    def _find_hit(
        cls, search: CacheHitSearch
    ) -> tuple[list[KVCacheBlock], ...]:  # pragma: no cover - never constructed
        raise NotImplementedError

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:  # pragma: no cover
        raise NotImplementedError


class CrossAttentionManager(_UnbuiltManager):
    """Cross-attention layers (encoder-decoder models)."""

    feature = "cross-attention (encoder-decoder models)"


class RSWAManager(_UnbuiltManager):
    """Reference sliding-window attention layers."""

    feature = "reference sliding-window attention (R-SWA)"
