"""Coordinates the single-type managers of all KV cache groups.

Every group has its own manager and block tables, but all draw from one
block pool. Only models with a single group are coordinated with prefix
caching; any number of groups runs without it (hybrid attention + Mamba
models, whose state layers rule prefix caching out anyway).
"""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm.logger import init_logger
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager import get_manager_for_kv_cache_spec
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = init_logger(__name__)


def _admission_cap(
    spec: KVCacheSpec, max_in_flight_tokens: int | None, max_model_len: int
) -> int | None:
    """Most blocks one request of a windowed spec holds at once (the same bound
    the KV cache was sized with); None for specs that keep every block."""
    if not isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return None
    in_flight = max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
    return spec.max_admission_blocks_per_request(in_flight, max_model_len)


class KVCacheCoordinator(ABC):
    """Fans the KV cache manager's calls out to one manager per group."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks, enable_caching, hash_block_size, enable_kv_cache_events
        )
        # EAGLE needs special handling in find_longest_cache_hit.
        self.use_eagle = use_eagle
        self.single_type_managers = tuple(
            get_manager_for_kv_cache_spec(
                kv_cache_spec=group.kv_cache_spec,
                block_pool=self.block_pool,
                enable_caching=enable_caching,
                kv_cache_group_id=i,
                max_admission_blocks_per_request=_admission_cap(
                    group.kv_cache_spec, max_in_flight_tokens, max_model_len
                ),
            )
            for i, group in enumerate(kv_cache_config.kv_cache_groups)
        )
        # Requests hash hash_block_size tokens at a time and the hits are
        # looked up hash by hash: with caching each block must span that many.
        for manager in self.single_type_managers if enable_caching else ():
            if manager.block_size != hash_block_size:
                raise ValueError(
                    f"hash_block_size ({hash_block_size}) must equal the block size "
                    f"({manager.block_size}) of KV cache group "
                    f"{manager.kv_cache_group_id} when prefix caching is enabled."
                )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Free blocks all groups together need for ``num_tokens`` slots."""
        return sum(
            manager.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks[i],
                total_computed_tokens,
                apply_admission_cap=apply_admission_cap,
            )
            for i, manager in enumerate(self.single_type_managers)
        )

    def save_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        total_computed_tokens: int,
    ) -> None:
        """Add the prefix-cache hits of each group to the request."""
        for i, manager in enumerate(self.single_type_managers):
            manager.save_new_computed_blocks(
                request_id, new_computed_blocks[i], total_computed_tokens
            )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int
    ) -> tuple[list[KVCacheBlock], ...]:
        """Give the request ``num_tokens`` slots in every group; return the
        new blocks per group."""
        return tuple(
            manager.allocate_new_blocks(request_id, num_tokens)
            for manager in self.single_type_managers
        )

    def cache_blocks(self, request: "Request", num_computed_tokens: int) -> None:
        """Cache the request's full blocks among its first
        ``num_computed_tokens`` tokens, in every group."""
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        """Release the request's blocks in every group."""
        for manager in self.single_type_managers:
            manager.free(request_id)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, the leading blocks shared by every request holding blocks."""
        return [
            manager.get_num_common_prefix_blocks(running_request_id)
            for manager in self.single_type_managers
        ]

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free blocks the attention no longer reads (null blocks replace them)."""
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, total_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        """The request's blocks per group (empty lists if it holds none)."""
        return tuple(
            manager.req_to_blocks.get(request_id) or [] for manager in self.single_type_managers
        )

    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest prefix-cache hit valid in every group.

        Returns:
            The hit blocks per group and the hit length in tokens.
        """


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Coordinator when prefix caching is off: any number of groups
    (including none), no cache hits."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        use_eagle: bool,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        super().__init__(
            kv_cache_config,
            max_model_len,
            use_eagle,
            False,
            enable_kv_cache_events,
            hash_block_size,
            max_in_flight_tokens,
        )
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_single_type_manager

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        return tuple([] for _ in range(self.num_single_type_manager)), 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for models with one KV cache group, i.e. one KV cache type
    (all full attention, or all sliding window with one window size)."""

    @property
    def kv_cache_spec(self) -> KVCacheSpec:
        return self.single_type_managers[0].kv_cache_spec

    @property
    def block_size(self) -> int:
        """The group's block size (tokens per block)."""
        return self.single_type_managers[0].block_size

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        assert len(self.single_type_managers) == 1, "one KV cache group expected"
        manager = self.single_type_managers[0]
        return manager.find_longest_cache_hit(
            block_hashes=block_hashes,
            max_length=max_cache_hit_length,
            kv_cache_group_ids=[0],
            block_pool=self.block_pool,
            kv_cache_spec=manager.kv_cache_spec,
            drop_eagle_block=self.use_eagle,
            alignment_tokens=manager.block_size,
        )


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Upstream's coordinator for prefix caching over several KV cache groups
    of different attention types (hybrid models). Not built: hybrid models run
    without prefix caching here, and constructing this is refused."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            "Prefix caching with several KV cache groups (hybrid models) is not "
            "supported; disable prefix caching."
        )

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:  # pragma: no cover - never constructed
        raise NotImplementedError


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    use_eagle: bool,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    hash_block_size: int,
    max_in_flight_tokens: int | None = None,
) -> KVCacheCoordinator:
    """The coordinator for this config: no-prefix-cache, or unitary.

    Raises:
        NotImplementedError: For prefix caching over several KV cache groups
            (hybrid models), which needs the hybrid coordinator.
    """
    # Mamba states summarise whole prefixes and cannot be shared: such models
    # run without prefix caching (upstream disables it for them too).
    if enable_caching and any(
        isinstance(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups
    ):
        logger.warning_once(
            "Prefix caching is not supported with Mamba state layers; it is disabled."
        )
        enable_caching = False
    # Without groups (attention-free model) there is nothing to cache.
    if not enable_caching or not kv_cache_config.kv_cache_groups:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config,
            max_model_len,
            use_eagle,
            enable_kv_cache_events,
            hash_block_size,
            max_in_flight_tokens,
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config,
            max_model_len,
            use_eagle,
            enable_caching,
            enable_kv_cache_events,
            hash_block_size,
            max_in_flight_tokens,
        )
    raise NotImplementedError(
        "Prefix caching with several KV cache groups (hybrid models) is not "
        "supported; disable prefix caching."
    )
