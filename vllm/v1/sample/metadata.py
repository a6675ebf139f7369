"""The per-step sampling parameters of a batch (upstream: vllm/v1/sample/metadata.py).

The model runner's persistent `InputBatch` keeps one row per request; this is
the view of those rows that `Sampler.forward` reads. Tensors are indexed by the
batch row and have `num_reqs` rows. A tensor is None when no request in the
batch needs it, which is what lets the sampler skip whole stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm.v1.sample.logits_processor import LogitsProcessors


@dataclass
class SamplingMetadata:
    # [num_reqs] float32. Greedy rows hold a value below the sampling epsilon.
    # None when every request is greedy.
    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool

    # [num_reqs] float32 in (0, 1]; 1.0 = no top-p for that row. None when no
    # request uses top-p.
    top_p: torch.Tensor | None
    # [num_reqs] int32; vocab_size = no top-k for that row. None when no
    # request uses top-k.
    top_k: torch.Tensor | None
    # [num_reqs] float32 in [0, 1]; 0.0 = no min-p. None when no request uses it.
    min_p: torch.Tensor | None

    # batch row -> generator, for seeded requests only.
    generators: dict[int, torch.Generator]

    # None: no logprobs. 0: the sampled token's logprob only. k > 0: also the
    # top k. -1: the whole vocabulary.
    max_num_logprobs: int | None

    # ---- penalties (all None when no_penalties) ----
    no_penalties: bool = True
    # [num_reqs, max_prompt_len] int64, padded with vocab_size.
    prompt_token_ids: torch.Tensor | None = None
    # [num_reqs] float32; rows without the penalty hold 0, 0 and 1.
    frequency_penalties: torch.Tensor | None = None
    presence_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None

    # The output token ids of each row (the batch's own lists): penalties and
    # bad words read them.
    output_token_ids: list[list[int]] = field(default_factory=list)

    # [num_reqs, vocab] bool, True = forbidden (outside allowed_token_ids).
    # None when no request restricts its tokens.
    allowed_token_ids_mask: torch.Tensor | None = None

    # row -> the request's bad words as token-id sequences.
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)

    # logit bias, min_tokens
    logitsprocs: LogitsProcessors = field(default_factory=LogitsProcessors)
