"""Turning the engine's logprob arrays into per-token entries
(upstream: vllm/v1/engine/logprobs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm.logprobs import (
    FlatLogprobs,
    PromptLogprobs,
    SampleLogprobs,
    append_logprobs_for_next_position,
    create_prompt_logprobs,
    create_sample_logprobs,
)
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
from vllm.v1.outputs import LogprobsLists, LogprobsTensors

if TYPE_CHECKING:
    from vllm.tokenizers import TokenizerLike


@dataclass
class LogprobsProcessor:
    """Accumulates a request's sample and prompt logprobs across steps, in
    the plain or the flat container (`SamplingParams.flat_logprobs`)."""

    tokenizer: TokenizerLike | None
    logprobs: SampleLogprobs | None  # None unless the request asked for logprobs
    prompt_logprobs: PromptLogprobs | None  # None unless it asked for prompt logprobs
    cumulative_logprob: float | None
    num_logprobs: int | None
    num_prompt_logprobs: int | None

    @classmethod
    def from_new_request(
        cls, tokenizer: TokenizerLike | None, request: EngineCoreRequest
    ) -> LogprobsProcessor:
        params = request.sampling_params
        assert params is not None
        num_logprobs = params.logprobs
        num_prompt_logprobs = params.prompt_logprobs
        flat = params.flat_logprobs
        return cls(
            tokenizer=tokenizer,
            logprobs=None if num_logprobs is None else create_sample_logprobs(flat),
            # The first prompt token has no logprob: it is not predicted.
            prompt_logprobs=(None if num_prompt_logprobs is None else create_prompt_logprobs(flat)),
            cumulative_logprob=None if num_logprobs is None else 0.0,
            num_logprobs=num_logprobs,
            num_prompt_logprobs=num_prompt_logprobs,
        )

    def update_from_output(self, output: EngineCoreOutput) -> None:
        if output.new_logprobs is not None:
            self._update_sample_logprobs(output.new_logprobs)
        if output.new_prompt_logprobs_tensors is not None:
            self._update_prompt_logprobs(output.new_prompt_logprobs_tensors)

    def _update_sample_logprobs(self, lists: LogprobsLists) -> None:
        assert self.logprobs is not None and self.num_logprobs is not None
        for ids, values, rank in zip(
            lists.logprob_token_ids, lists.logprobs, lists.sampled_token_ranks
        ):
            # Entry 0 is the sampled token; the rest are the top-k, ranked 1..k.
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + values[0]
            append_logprobs_for_next_position(
                self.logprobs, ids, values, self._decode_all(ids), rank, self.num_logprobs
            )

    def _update_prompt_logprobs(self, tensors: LogprobsTensors) -> None:
        assert self.prompt_logprobs is not None and self.num_prompt_logprobs is not None
        lists = tensors.tolists()
        for ids, values, rank in zip(
            lists.logprob_token_ids, lists.logprobs, lists.sampled_token_ranks
        ):
            append_logprobs_for_next_position(
                self.prompt_logprobs,
                ids,
                values,
                self._decode_all(ids),
                rank,
                self.num_prompt_logprobs,
            )

    def _decode_all(self, token_ids: list[int]) -> list[str | None]:
        if self.tokenizer is None:
            return [None] * len(token_ids)
        # One token at a time, as upstream: a byte of a multi-byte character
        # shows as U+FFFD here; the output text is decoded incrementally instead.
        return [self.tokenizer.decode([t]) for t in token_ids]

    def pop_prompt_logprobs(self) -> PromptLogprobs | None:
        """Prompt logprobs so far, then forget them (DELTA outputs send them once)."""
        plp = self.prompt_logprobs
        if plp:
            # An empty container of the same kind; later chunks start past
            # position 0, so without its leading None.
            self.prompt_logprobs = FlatLogprobs() if isinstance(plp, FlatLogprobs) else []
        return plp
