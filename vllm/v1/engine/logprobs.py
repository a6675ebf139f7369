"""Turning the engine's logprob arrays into per-token dicts (upstream: vllm/v1/engine/logprobs.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.logprobs import Logprob, PromptLogprobs, SampleLogprobs
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest
from vllm.v1.outputs import LogprobsLists, LogprobsTensors


@dataclass
class LogprobsProcessor:
    """Accumulates a request's sample and prompt logprobs across steps."""

    tokenizer: Any | None
    logprobs: SampleLogprobs | None  # None unless the request asked for logprobs
    prompt_logprobs: PromptLogprobs | None  # None unless it asked for prompt logprobs
    cumulative_logprob: float | None
    num_logprobs: int | None
    num_prompt_logprobs: int | None

    @classmethod
    def from_new_request(cls, tokenizer: Any | None,
                         request: EngineCoreRequest) -> "LogprobsProcessor":
        params = request.sampling_params
        assert params is not None
        num_logprobs = params.logprobs
        num_prompt_logprobs = params.prompt_logprobs
        return cls(tokenizer=tokenizer,
                   logprobs=None if num_logprobs is None else [],
                   # The first prompt token has no logprob: it is not predicted.
                   prompt_logprobs=None if num_prompt_logprobs is None else [None],
                   cumulative_logprob=None if num_logprobs is None else 0.0,
                   num_logprobs=num_logprobs, num_prompt_logprobs=num_prompt_logprobs)

    def update_from_output(self, output: EngineCoreOutput) -> None:
        if output.new_logprobs is not None:
            self._update_sample_logprobs(output.new_logprobs)
        if output.new_prompt_logprobs_tensors is not None:
            self._update_prompt_logprobs(output.new_prompt_logprobs_tensors)

    def _update_sample_logprobs(self, lists: LogprobsLists) -> None:
        assert self.logprobs is not None and self.num_logprobs is not None
        for ids, values, rank in zip(lists.logprob_token_ids, lists.logprobs,
                                     lists.sampled_token_ranks):
            # Entry 0 is the sampled token; the rest are the top-k, ranked 1..k.
            k = len(ids) - 1 if self.num_logprobs == -1 else self.num_logprobs
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + values[0]
            self.logprobs.append(self._make_dict(ids[:k + 1], values[:k + 1], rank))

    def _update_prompt_logprobs(self, tensors: LogprobsTensors) -> None:
        assert self.prompt_logprobs is not None
        lists = tensors.tolists()
        for ids, values, rank in zip(lists.logprob_token_ids, lists.logprobs,
                                     lists.sampled_token_ranks):
            k = len(ids) - 1 if self.num_prompt_logprobs == -1 else self.num_prompt_logprobs
            self.prompt_logprobs.append(self._make_dict(ids[:k + 1], values[:k + 1], rank))

    def _make_dict(self, ids: list[int], values: list[float], rank: int) -> dict[int, Logprob]:
        ranks = [rank, *range(1, len(ids))]
        texts = [self._decode(i) for i in ids]
        # A sampled token that is also in the top-k keeps one entry.
        return {tid: Logprob(logprob=v, rank=r, decoded_token=t)
                for tid, v, r, t in zip(ids, values, ranks, texts)}

    def _decode(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode([token_id])

    def pop_prompt_logprobs(self) -> PromptLogprobs | None:
        """Prompt logprobs so far, then forget them (DELTA outputs send them once)."""
        plp = self.prompt_logprobs
        if plp:
            self.prompt_logprobs = []
        return plp
