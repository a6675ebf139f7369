"""The scheduler's interface to the paged KV cache and its prefix cache."""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

from vllm.distributed.kv_events import BlockStored, KVCacheEvent
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_coordinator import get_kv_cache_coordinator
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    MambaSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

logger = init_logger(__name__)


@dataclass
class KVCacheBlocks:
    """Blocks handed between KVCacheManager and the scheduler, hiding the
    manager's internal structures.

    ``blocks[i][j]`` is the j-th block of KV cache group i. Groups are the outer
    dimension because groups may one day have different block sizes, and so
    different numbers of blocks. An empty group is an empty tuple.
    """

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        """Concatenate the blocks of each group."""
        return KVCacheBlocks(
            tuple(
                list(itertools.chain(blocks_1, blocks_2))
                for blocks_1, blocks_2 in zip(self.blocks, other.blocks)
            )
        )

    @overload
    def get_block_ids(self, allow_none: Literal[False] = False) -> tuple[list[int], ...]: ...

    @overload
    def get_block_ids(self, allow_none: bool) -> tuple[list[int], ...] | None: ...

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        """Block ids per group; None if ``allow_none`` and there are no blocks."""
        if allow_none and all(len(group) == 0 for group in self.blocks):
            return None
        return tuple([block.block_id for block in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of the blocks without a hash (single-group only)."""
        assert len(self.blocks) == 1, "Only one group is supported"
        return [block.block_id for block in self.blocks[0] if block.block_hash is None]

    def new_empty(self) -> "KVCacheBlocks":
        """A KVCacheBlocks with as many groups as this one and no blocks."""
        return KVCacheBlocks(tuple(() for _ in range(len(self.blocks))))


def _check_scheduler_block_size(
    kv_cache_config: KVCacheConfig, scheduler_block_size: int | None
) -> None:
    """Refuse a scheduler block size other than the groups' one block size."""
    if scheduler_block_size is None or not kv_cache_config.kv_cache_groups:
        return
    # One group (or groups of one block size): the scheduler allocates in
    # that block size. Mamba groups hold one state slot per request (their
    # block_size is max_model_len, not a paging granularity), so only
    # token-paged groups set the scheduler's block size.
    paged = [
        g for g in kv_cache_config.kv_cache_groups if not isinstance(g.kv_cache_spec, MambaSpec)
    ]
    if not paged:
        return
    sizes = sorted({g.kv_cache_spec.block_size for g in paged})
    if len(sizes) > 1:
        raise NotImplementedError(
            f"KV cache groups with different block sizes {sizes} (scheduler_block_size="
            f"{scheduler_block_size}) need the hybrid KV cache manager, which is not built."
        )
    if scheduler_block_size != sizes[0]:
        raise NotImplementedError(
            f"scheduler_block_size={scheduler_block_size}: only the groups' block size "
            f"({sizes[0]}) is supported (a coarser scheduling granularity is not built)."
        )


class KVCacheManager:
    """Allocates KV cache blocks to requests and finds prefix-cache hits.

    Args:
        kv_cache_config: The KV cache layout (blocks, groups).
        max_model_len: The longest sequence; no request gets more slots.
        hash_block_size: The block size the requests' block hashes use; must
            equal the block size of the (single) KV cache group.
        enable_caching: Whether to enable prefix caching.
        use_eagle: Whether EAGLE speculative decoding is used (the last hit
            block is dropped so that its hidden states are recomputed).
        log_stats: Whether to collect prefix-cache hit statistics.
        enable_kv_cache_events: Record KV cache events (see `BlockPool`).
        watermark: Fraction of the blocks kept free when admitting waiting or
            preempted requests while others run.

    Upstream's constructor also takes context-parallel sizes, a prefill
    lookahead (speculative decoding) and a residency metrics collector; none
    of those features is built here, so neither are the parameters.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int | None = None,
        hash_block_size: int | None = None,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
    ) -> None:
        _check_scheduler_block_size(kv_cache_config, scheduler_block_size)
        if hash_block_size is None:
            raise TypeError("KVCacheManager needs hash_block_size")
        if watermark < 0.0:
            raise ValueError(f"watermark must be non-negative, got {watermark}")
        self.max_model_len = max_model_len
        # Tokens scheduled but not yet processed (upstream sizes admission caps
        # of windowed attention with it); defaults to max_model_len.
        self.max_in_flight_tokens = (
            max_model_len if max_in_flight_tokens is None else max_in_flight_tokens
        )
        # Blocks kept free when admitting waiting / preempted requests while
        # others are running, so that the running ones can grow.
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config=kv_cache_config,
            max_model_len=max_model_len,
            use_eagle=use_eagle,
            enable_caching=enable_caching,
            enable_kv_cache_events=enable_kv_cache_events,
            hash_block_size=hash_block_size,
            max_in_flight_tokens=self.max_in_flight_tokens,
        )
        self.kv_cache_config = kv_cache_config
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        # One shared, immutable empty result: handing it out instead of a new
        # object per call saves garbage-collector work.
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups))
        )

    def new_step_starts(self) -> None:
        """Upstream's per-step hook (its Mamba prefix-caching mode keeps state
        per step); no manager here keeps any, so there is nothing to reset."""

    @property
    def usage(self) -> float:
        """Fraction of the KV cache in use (0.0 - 1.0)."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Return the hit counters since the last call and start new ones
        (None when stats are off)."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        """Find the request's prefix-cache hit. Only full blocks can hit.

        Returns:
            - the hit blocks (not yet referenced: pass them to allocate_slots),
            - the number of hit tokens,
            - the shared-prefix boundary: a block-aligned position of a shared
              prefix that a hybrid model's sparse group has not cached yet.
              Always 0 here, since hybrid models are not supported.
        """
        # E.g. requests that want prompt logprobs need the logits of every
        # prompt token, so they skip the cache.
        if not self.enable_caching or request.get_skip_reading_prefix_cache():
            return self.empty_kv_cache_blocks, 0, 0

        # When the whole prompt hits, the last token must still be computed to
        # get logits, so at most num_tokens - 1 tokens can hit. Hits are whole
        # blocks, so this may recompute a full block rather than one token.
        max_cache_hit_length = request.num_tokens - 1
        computed_blocks, num_new_computed_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length
        )
        # A request asking for "full" KV cache reports (sampling_params
        # extra_args kv_cache_report_mode) also gets events for the blocks
        # it reuses, not only for the ones it stores.
        if (
            num_new_computed_tokens
            and self.block_pool.enable_kv_cache_events
            and request.kv_cache_report_mode == "full"
        ):
            for group_id, group_blocks in enumerate(computed_blocks):
                block_size = self.kv_cache_config.kv_cache_groups[group_id].kv_cache_spec.block_size
                self.block_pool.emit_cached_block_events(
                    request, len(group_blocks), block_size, group_id
                )
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens,
                num_hits=num_new_computed_tokens,
                preempted=request.num_preemptions > 0,
            )
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, 0

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Give the request slots for ``num_new_tokens`` more tokens.

        Args:
            request: The request.
            num_new_tokens: Tokens to be computed this step, including
                unverified draft tokens.
            num_new_computed_tokens: Tokens just found in the prefix cache
                (from get_computed_blocks), external tokens excluded.
            new_computed_blocks: The blocks of those hits.
            num_lookahead_tokens: Extra slots for speculative tokens of
                proposers with their own KV cache (e.g. EAGLE).
            num_external_computed_tokens: Tokens whose KV a KV connector
                provides (not cached by vLLM).
            delay_cache_blocks: Do not cache the blocks yet (their KV arrives
                in a later step, e.g. through a KV transfer).
            num_encoder_tokens: Encoder tokens for cross-attention; must be 0
                (encoder-decoder models are not supported).
            full_sequence_must_fit: Admission gate: allocate only if blocks for
                the whole sequence (request.num_tokens, hits counted) are free,
                not just for this step's chunk.
            reserved_blocks: Free blocks to leave for other in-flight requests.
            has_scheduled_reqs: Whether other requests already run this step;
                the watermark applies to waiting / preempted requests only then.

        Token ranges of the request, left to right (the block table covers
        them in order):
        ```
        +--------+------------+------------+---------+-------------+
        |  comp  |  new_comp  |  ext_comp  |   new   |  lookahead  |
        +--------+------------+------------+---------+-------------+
        |<- computed before this step ---->|
                                           |<- computed now ------>|
                 |<- block table grows here ---------------------->|
                 |<- full blocks cached ------------>|
        |<- may be dropped out of window ->|
        ```
        where
        ```
        comp      = request.num_computed_tokens (blocks held already)
        new_comp  = num_new_computed_tokens: prefix-cache hits, referenced
                    here (len(new_computed_blocks) * block_size)
        ext_comp  = num_external_computed_tokens: KV a connector provides,
                    which vLLM has not cached
        new       = num_new_tokens, unverified draft tokens included
        lookahead = num_lookahead_tokens
        ```

        Only finalized tokens are cached: the number cached is capped at
        ``request.num_tokens``, which excludes draft tokens.

        The allocation has three stages:
        - Free blocks that left the attention window (even if the allocation
          then fails: it leaves more blocks for others).
        - Check that enough blocks are free, hits that sit in the free queue
          included; return None if not, touching nothing.
        - Reference the hits, take new blocks for ``ext_comp + new +
          lookahead``, and cache the blocks that are now full.

        Returns:
            The newly allocated blocks, or None if there are not enough free
            blocks.
        """
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no external computed tokens"
            )
        if num_encoder_tokens:
            raise NotImplementedError("Cross-attention KV cache is not supported.")
        new_computed_block_list = (
            new_computed_blocks.blocks
            if new_computed_blocks is not None
            else self.empty_kv_cache_blocks.blocks
        )
        num_local_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        total_computed_tokens = min(
            num_local_computed_tokens + num_external_computed_tokens, self.max_model_len
        )
        num_tokens_need_slot = min(
            total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )

        # With async scheduling, num_computed_tokens already counts the tokens
        # of the step still running, whose attention reads one window back
        # from them: free relative to the tokens actually processed.
        watermark_blocks = 0
        if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            watermark_blocks = self.watermark_blocks
        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            needed = self.coordinator.get_num_blocks_to_allocate(
                request.request_id,
                full_num_tokens,
                new_computed_block_list,
                total_computed_tokens,
                apply_admission_cap=True,
            )
            if needed + watermark_blocks > self.block_pool.get_num_free_blocks():
                return None
        self.coordinator.remove_skipped_blocks(
            request.request_id,
            max(0, total_computed_tokens - request.num_output_placeholders),
        )
        num_blocks_to_allocate = self.coordinator.get_num_blocks_to_allocate(
            request.request_id,
            num_tokens_need_slot,
            new_computed_block_list,
            total_computed_tokens,
        )
        available_blocks = self.block_pool.get_num_free_blocks() - reserved_blocks
        if num_blocks_to_allocate + watermark_blocks > available_blocks:
            return None

        # Reference the hits first, so that taking new blocks cannot evict them.
        self.coordinator.save_new_computed_blocks(
            request.request_id, new_computed_block_list, total_computed_tokens
        )
        new_blocks = self.coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        if self.enable_caching and not delay_cache_blocks:
            num_tokens_to_cache = min(total_computed_tokens + num_new_tokens, request.num_tokens)
            self.coordinator.cache_blocks(request, num_tokens_to_cache)
        return self.create_kv_cache_blocks(new_blocks)

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail blocks first (so that with
        caching on, a request's tail blocks are evicted before its head)."""
        self.coordinator.free(request.request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free blocks the attention no longer reads (e.g. out of the sliding
        window); null blocks take their place."""
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks (e.g. after a weight update).

        Returns:
            True on success; False if some request still holds blocks.
        """
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, the number of leading blocks shared by all requests.

        A block of ``running_request_id`` is common if every request holding
        blocks references it (ref_cnt == number of such requests).

        NOTE: requests holding blocks can outnumber the requests scheduled in
        this step (a running request may be left out of a step). One of them
        that does not share the prefix makes the result 0 even if all
        scheduled requests share it; this cannot be detected cheaply.
        """
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[KVCacheEvent]:
        """The KV cache events since the last call (see `BlockPool`); stored
        blocks are labelled with their group's spec kind and window here (the
        pool knows blocks, not specs)."""
        events = self.block_pool.take_events()
        groups = self.kv_cache_config.kv_cache_groups
        for event in events:
            if isinstance(event, BlockStored) and event.group_idx is not None:
                if not 0 <= event.group_idx < len(groups):
                    logger.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                    continue
                spec = groups[event.group_idx].kv_cache_spec
                event.kv_cache_spec_kind = get_kv_cache_spec_kind(spec).value
                event.kv_cache_spec_sliding_window = get_kv_cache_spec_sliding_window(spec)
        return events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The blocks of a request."""
        return self.create_kv_cache_blocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The block ids of a request, per group."""
        return self.get_blocks(request_id).get_block_ids()

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks among its first
        ``num_computed_tokens`` tokens (no-op when caching is off)."""
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> KVCacheBlocks:
        """Wrap ``blocks``; the shared empty instance if there are none."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks
