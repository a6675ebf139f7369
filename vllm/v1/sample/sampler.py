"""The V1 sampler: logits -> one token per request (upstream: vllm/v1/sample/sampler.py).

Order of operations, as upstream:
  1. raw logprobs (or raw logits), if logprobs were asked for and the mode is raw_*
  2. logits -> float32
  3. `apply_logits_processors`: allowed_token_ids (everything else -> -inf),
     bad words, the non-argmax-invariant processors (min_tokens masks the stop
     ids, logit bias), then repetition / frequency / presence penalties
  4. greedy rows: argmax. Other rows: / temperature, the argmax-invariant
     processors, min-p, top-k/top-p, then a random draw (per-request generator
     when seeded)
  5. top-k logprobs plus the sampled token's logprob and rank

Every stage is one batched op over the rows (the only Python loops are over
the seeded rows' generators and over the bad words of the rows that have
some, never over the vocabulary).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from vllm.v1.outputs import LogprobsTensors, SamplerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.bad_words import apply_bad_words
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

# A temperature below this means greedy (same constant as SamplingParams).
_SAMPLING_EPS = 1e-5

LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


class Sampler(nn.Module):
    """Samples the next token of every request in the batch.

    `forward(logits [num_reqs, vocab], sampling_metadata)` returns a
    `SamplerOutput` with `sampled_token_ids` [num_reqs, 1] int32 and, when
    `max_num_logprobs` is set, `logprobs_tensors` whose column 0 is the sampled
    token and columns 1.. its row's top-k.
    """

    def __init__(self, logprobs_mode: str = "raw_logprobs") -> None:
        super().__init__()
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"Unknown logprobs_mode {logprobs_mode!r}; expected one of {LOGPROBS_MODES}."
            )
        self.logprobs_mode = logprobs_mode
        self.topk_topp_sampler = TopKTopPSampler(logprobs_mode)

    def forward(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> SamplerOutput:
        num_logprobs = sampling_metadata.max_num_logprobs
        raw_logprobs: torch.Tensor | None = None
        if num_logprobs is not None:
            if self.logprobs_mode == "raw_logprobs":
                raw_logprobs = self.compute_logprobs(logits)
            elif self.logprobs_mode == "raw_logits":
                raw_logprobs = logits.to(torch.float32, copy=True)

        logits = logits.to(torch.float32)
        logits = self.apply_logits_processors(logits, sampling_metadata)
        sampled, processed_logprobs = self.sample(logits, sampling_metadata)
        if processed_logprobs is not None:
            raw_logprobs = processed_logprobs

        logprobs_tensors = None
        if num_logprobs is not None:
            assert raw_logprobs is not None
            logprobs_tensors = self.gather_logprobs(raw_logprobs, num_logprobs, sampled)
        # int32 keeps the tensor small; token ids fit.
        sampled = sampled.to(torch.int32).unsqueeze(-1)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=logprobs_tensors)

    def apply_logits_processors(
        self, logits: torch.Tensor, sampling_metadata: SamplingMetadata
    ) -> torch.Tensor:
        """The edits that can change the argmax, applied to every row (greedy
        ones included). logits: [num_reqs, vocab] float32, edited in place."""
        if sampling_metadata.allowed_token_ids_mask is not None:
            logits.masked_fill_(sampling_metadata.allowed_token_ids_mask, float("-inf"))
        if sampling_metadata.bad_words_token_ids:
            apply_bad_words(
                logits, sampling_metadata.bad_words_token_ids, sampling_metadata.output_token_ids
            )
        for processor in sampling_metadata.logitsprocs.non_argmax_invariant:
            logits = processor.apply(logits)
        return self.apply_penalties(logits, sampling_metadata)

    @staticmethod
    def apply_penalties(logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
        if sampling_metadata.no_penalties:
            return logits
        md = sampling_metadata
        # All set when a row has a penalty (no_penalties is False).
        assert md.prompt_token_ids is not None
        assert md.presence_penalties is not None
        assert md.frequency_penalties is not None
        assert md.repetition_penalties is not None
        return apply_all_penalties(
            logits,
            md.prompt_token_ids,
            md.presence_penalties,
            md.frequency_penalties,
            md.repetition_penalties,
            md.output_token_ids,
        )

    def sample(
        self,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy and random sampling. Returns (token ids [num_reqs] int64,
        processed logits/logprobs when a processed_* logprobs mode wants them)."""
        assert not (sampling_metadata.all_greedy and sampling_metadata.all_random)
        greedy_sampled: torch.Tensor | None = None
        if not sampling_metadata.all_random:
            greedy_sampled = self.greedy_sample(logits)
            if sampling_metadata.all_greedy:
                processed = None
                if self.logprobs_mode == "processed_logits":
                    processed = logits
                elif self.logprobs_mode == "processed_logprobs":
                    processed = self.compute_logprobs(logits)
                return greedy_sampled, processed

        temperature = sampling_metadata.temperature
        assert temperature is not None
        logits = self.apply_temperature(logits, temperature, sampling_metadata.all_random)
        for processor in sampling_metadata.logitsprocs.argmax_invariant:
            logits = processor.apply(logits)
        # Min-p does not change the argmax, so it only matters for random rows.
        if sampling_metadata.min_p is not None:
            logits = self.apply_min_p(logits, sampling_metadata.min_p)
        random_sampled, processed = self.topk_topp_sampler(
            logits, sampling_metadata.generators, sampling_metadata.top_k, sampling_metadata.top_p
        )
        if greedy_sampled is None:
            return random_sampled, processed
        sampled = torch.where(temperature < _SAMPLING_EPS, greedy_sampled, random_sampled)
        return sampled, processed

    @staticmethod
    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1).view(-1)

    @staticmethod
    def apply_temperature(
        logits: torch.Tensor, temperature: torch.Tensor, all_random: bool
    ) -> torch.Tensor:
        """Divide each row by its temperature, in place. Greedy rows of a mixed
        batch divide by 1 instead (their random draw is discarded anyway)."""
        if not all_random:
            temperature = torch.where(temperature < _SAMPLING_EPS, 1.0, temperature)
        return logits.div_(temperature.unsqueeze(1))

    @staticmethod
    def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
        """Drop tokens whose probability is below min_p times the row's top
        probability. logits [num_reqs, vocab] is modified in place."""
        probs = logits.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
        return logits.masked_fill_(probs < threshold, float("-inf"))

    @staticmethod
    def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
        return logits.log_softmax(dim=-1, dtype=torch.float32)

    @staticmethod
    def gather_logprobs(
        logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
    ) -> LogprobsTensors:
        """The sampled token's logprob and rank, then the row's top `num_logprobs`.

        logprobs: [n, vocab] float32; token_ids: [n] int64.
        Returns ids [n, 1 + k] int32, logprobs [n, 1 + k] float32, ranks [n]
        (rank 1 = most likely; tokens tied with the sampled one count as above it).
        """
        if num_logprobs == -1:
            num_logprobs = logprobs.shape[-1]
        topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)
        token_ids = token_ids.to(torch.long).unsqueeze(-1)
        token_logprobs = logprobs.gather(-1, token_ids)
        token_ranks = (logprobs >= token_logprobs).sum(-1)
        indices = torch.cat((token_ids, topk_indices), dim=1).to(torch.int32)
        values = torch.cat((token_logprobs, topk_logprobs), dim=1)
        return LogprobsTensors(indices, values, token_ranks)
