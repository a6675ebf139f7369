"""Suffix Decoding drafter (upstream: vllm/v1/spec_decode/suffix_decoding.py).

Suffix Decoding (https://arxiv.org/abs/2411.04975) drafts from suffix trees
instead of a model: a per-request tree over the request's prompt and output
so far, and one global tree over the responses of recent requests (so a
request can reuse what an earlier, similar request generated). Each step the
last `suffix_decoding_max_tree_depth` tokens of the request are matched
against both trees, and the continuation with the higher score (the sum of
its tokens' estimated probabilities, from frequency counts) is the draft.
The draft length varies per request and step: at most num_speculative_tokens,
at most max_spec_factor x the matched length, and it stops at the first token
whose estimated probability falls under min_token_prob.

The trees are the Arctic Inference library's (`arctic_inference.
suffix_decoding.SuffixDecodingCache`, a C++ extension), as upstream; it is an
optional dependency, checked when SpeculativeConfig is built (method
"suffix"), imported here only when the drafter is built.

Request lifetime in the cache (upstream's rules):
  - a request's tree starts the first time it has a sampled token (after
    its prefill), built from its prompt; a request whose id still has a
    response in the global cache (a preempted request coming back) has that
    response evicted first, and starts again from its prompt;
  - each step's sampled tokens are appended to its tree and to its response
    in the global tree;
  - a request no longer in the batch (finished, aborted or preempted) is
    stopped: its tree is dropped, its response stays in the global cache
    until FIFO eviction past suffix_decoding_max_cached_requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.config.speculative import ARCTIC_INFERENCE_INSTALL_HINT

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_input_batch import InputBatch


def import_suffix_decoding_cache() -> Any:
    """arctic_inference's SuffixDecodingCache class, or an ImportError that
    says how to install it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as e:
        raise ImportError(
            f"Arctic Inference is required for suffix decoding ({e}). "
            + ARCTIC_INFERENCE_INSTALL_HINT
        ) from e
    return SuffixDecodingCache


class SuffixDecodingProposer:
    """Drafts a variable number of tokens per request from suffix trees."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        config = vllm_config.speculative_config
        assert config is not None, "Speculative config must be set"
        assert config.num_speculative_tokens is not None
        assert vllm_config.model_config is not None
        self.num_speculative_tokens: int = config.num_speculative_tokens
        self.max_tree_depth: int = config.suffix_decoding_max_tree_depth
        self.max_spec_factor: float = config.suffix_decoding_max_spec_factor
        self.min_token_prob: float = config.suffix_decoding_min_token_prob
        self.max_model_len: int = vllm_config.model_config.max_model_len
        cache_cls = import_suffix_decoding_cache()
        # The per-request prompt trees and the global response tree; evicts
        # cached responses FIFO past max_cached_requests (0: no global tree).
        self.suffix_cache: Any = cache_cls(
            max_tree_depth=config.suffix_decoding_max_tree_depth,
            max_cached_requests=config.suffix_decoding_max_cached_requests,
        )

    def propose(
        self,
        num_speculative_tokens: int,
        input_batch: InputBatch,
        sampled_token_ids: list[list[int]],
        slot_mappings: Any = None,  # upstream's signature; no KV cache is written
    ) -> list[list[int]]:
        """One draft per batch row ([] for a row that sampled nothing this
        step, i.e. mid-prefill, or has reached max_model_len).
        `sampled_token_ids[i]`: the tokens row i emitted this step, already
        in `input_batch.token_ids_cpu` (num_tokens_no_spec counts them)."""
        assert num_speculative_tokens == self.num_speculative_tokens
        drafts = [
            self._propose_row(input_batch, row, sampled) if sampled else []
            for row, sampled in enumerate(sampled_token_ids)
        ]
        # Requests that left the batch: drop their prompt trees.
        for req_id in self.suffix_cache.active_requests - input_batch.req_id_to_index.keys():
            self.suffix_cache.stop_request(req_id)
        return drafts

    def _propose_row(self, batch: InputBatch, row: int, sampled: list[int]) -> list[int]:
        req_id = batch.req_ids[row]
        num_tokens = int(batch.num_tokens_no_spec[row])
        if num_tokens >= self.max_model_len:
            return []
        cache = self.suffix_cache
        if req_id not in cache.active_requests:
            if req_id in cache.cached_requests:
                # Same id back (preempted, or a reused id): start it afresh.
                cache.evict_cached_response(req_id)
            num_prompt = int(batch.num_prompt_tokens[row])
            # [num_prompt] int32, a contiguous row slice: the library's
            # zero-copy ndarray path.
            cache.start_request(req_id, batch.token_ids_cpu[row, :num_prompt])
        cache.add_active_response(req_id, sampled)
        # The trees are at most max_tree_depth deep: only that many of the
        # latest tokens can take part in a match.
        start = max(0, num_tokens - self.max_tree_depth)
        draft = cache.speculate(
            req_id,
            batch.token_ids_cpu[row, start:num_tokens],
            # The drafts and the token sampled after them must fit in max_model_len.
            max_spec_tokens=min(self.num_speculative_tokens, self.max_model_len - num_tokens - 1),
            max_spec_factor=self.max_spec_factor,
            min_token_prob=self.min_token_prob,
        )
        return [int(t) for t in draft.token_ids]

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """No model to load (the runner calls it on every drafter)."""
