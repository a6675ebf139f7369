"""The KV cache managers of groups whose requests hold fewer blocks than
their tokens span: sliding-window attention frees the blocks that left the
window, Mamba layers keep one state slot per request. Both are imported from
`vllm.v1.core.single_type_kv_cache_manager`, upstream's module for them.
"""

from typing import TYPE_CHECKING, Unpack

from vllm.utils import cdiv
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.single_type_kv_cache_manager_base import (
    CacheHitSearch,
    ManagerArgs,
    SingleTypeKVCacheManager,
)
from vllm.v1.kv_cache_interface import MambaSpec, SlidingWindowSpec

if TYPE_CHECKING:
    from vllm.v1.request import Request


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: a token attends to the last
    ``sliding_window`` tokens (itself included), so older blocks are freed."""

    def __init__(self, kv_cache_spec: SlidingWindowSpec, **kwargs: Unpack[ManagerArgs]) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    @classmethod
    def _find_hit(cls, search: CacheHitSearch) -> tuple[list[KVCacheBlock], ...]:
        spec = search.kv_cache_spec
        assert isinstance(spec, SlidingWindowSpec)
        block_size = search.block_size
        # A hit ending at block i only needs the blocks inside the window of
        # the next token: ceil((window - 1) / block_size) contiguous blocks
        # (-1: the next token itself is part of its window). EAGLE needs one
        # more, which is dropped at the end.
        num_needed = cdiv(spec.sliding_window - 1, block_size) + int(search.use_eagle)
        computed_blocks = tuple(
            [search.block_pool.null_block] * search.max_num_blocks
            for _ in search.kv_cache_group_ids
        )
        num_contiguous = 0
        # Search right to left: the first run of num_needed cached blocks is
        # the longest hit. Blocks before the run stay null.
        for i in range(search.max_num_blocks - 1, -1, -1):
            cached_blocks = search.block_pool.get_cached_block(
                search.block_hashes[i], search.kv_cache_group_ids
            )
            if cached_blocks is None:
                num_contiguous = 0
                continue
            if num_contiguous == 0 and (i + 1) * block_size % search.alignment_tokens != 0:
                continue  # A hit must end on an aligned boundary.
            for computed, cached in zip(computed_blocks, cached_blocks):
                computed[i] = cached
            num_contiguous += 1
            if num_contiguous >= num_needed:
                # Cut the blocks after the run: [N, N, 5, 2, N, 4] -> [N, N, 5, 2]
                # for a run of two (N = null block).
                for computed in computed_blocks:
                    del computed[i + num_contiguous :]
                break
        else:
            # No full run: only a run starting at block 0 (shorter than the
            # window, so nothing before it is needed) is a hit.
            for computed in computed_blocks:
                del computed[num_contiguous:]
            search.align(computed_blocks)
        search.drop_eagle_block(computed_blocks)
        return computed_blocks

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The next token (position num_computed_tokens) reads positions from
        # num_computed_tokens - sliding_window + 1 on.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        # The leading blocks are null blocks here, so ref counts say nothing
        # about sharing: report no common prefix.
        return 0


class MambaManager(SingleTypeKVCacheManager):
    """State-space layers: each request holds exactly one block, its state
    slot (the spec's block_size is max_model_len, so the generic allocation
    arithmetic never asks for a second one). A state summarises a whole
    prefix and is overwritten in place, so no prefix can be shared: no cache
    hits, no common prefix. A preempted request frees its slot and, resumed,
    recomputes its state from the first token."""

    def __init__(self, kv_cache_spec: MambaSpec, **kwargs: Unpack[ManagerArgs]) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        if self.enable_caching:
            raise ValueError("Prefix caching is not supported for Mamba state layers.")
        if kv_cache_spec.mamba_cache_mode != "none" or kv_cache_spec.num_speculative_blocks:
            raise NotImplementedError(
                f"MambaSpec(mamba_cache_mode={kv_cache_spec.mamba_cache_mode!r}, "
                f"num_speculative_blocks={kv_cache_spec.num_speculative_blocks}): only one "
                "state slot per request (mode 'none', no speculative blocks) is built."
            )

    @classmethod
    def _find_hit(cls, search: CacheHitSearch) -> tuple[list[KVCacheBlock], ...]:
        return search.no_hit()

    def cache_blocks(self, request: "Request", num_tokens: int) -> None:
        return None  # a state slot is never a reusable prefix

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0
