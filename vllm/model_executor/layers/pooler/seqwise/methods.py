"""Which hidden states make a request's row (upstream:
vllm/model_executor/layers/pooler/seqwise/methods.py).

Every method returns one entry per request: a [hidden] tensor, or None for a
request whose prompt is not complete after this step (chunked prefill). LAST
reads the last token of the final chunk. CLS and MEAN need the whole prompt:
the hidden states of earlier chunks wait in the request's PoolingStates
(`split_finished`) and are joined when the last chunk runs. (Upstream
disables chunked prefill for CLS / MEAN instead and raises on a partial
prefill; both give the same vectors.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set

import torch
import torch.nn as nn

from vllm.model_executor.layers.pooler.common import PoolingParamsUpdate
from vllm.tasks import PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

SeqPoolingOutput = list[torch.Tensor | None]


def split_finished(
    hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
) -> list[torch.Tensor | None]:
    """Each request's hidden states over its whole prompt, or None while it
    is mid-prefill (this step's chunk is then kept in its PoolingStates)."""
    cursor = pooling_metadata.get_pooling_cursor()
    states = pooling_metadata.pooling_states
    finished = cursor.is_finished().tolist()
    n_sched = cursor.num_scheduled_tokens_cpu.tolist()
    prompt_lens = cursor.prompt_lens_cpu.tolist()
    starts = torch.cumsum(cursor.num_scheduled_tokens_cpu, 0) - cursor.num_scheduled_tokens_cpu
    out: list[torch.Tensor | None] = []
    for i, start in enumerate(starts.tolist()):
        chunk = hidden_states[start : start + n_sched[i]]
        cache = states[i].hidden_states_cache if states is not None else None
        if not finished[i]:
            if cache is None:
                raise RuntimeError("a partial prefill needs the runner's PoolingStates")
            cache.append(chunk.clone())
            out.append(None)
            continue
        if cache:
            chunk = torch.cat([*cache, chunk])
            cache.clear()
        if chunk.shape[0] != prompt_lens[i]:
            raise RuntimeError(
                f"this pooler needs the hidden states of all {prompt_lens[i]} prompt tokens "
                f"but {chunk.shape[0]} were computed for the request (a prefix-cache hit "
                "skips tokens: run it with prefix caching off)"
            )
        out.append(chunk)
    return out


class SequencePoolingMethod(nn.Module, ABC):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"embed", "classify"}

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        return PoolingParamsUpdate()

    @abstractmethod
    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> SeqPoolingOutput:
        raise NotImplementedError


class CLSPool(SequencePoolingMethod):
    """The first prompt token's hidden state ([CLS] of BERT-style models)."""

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> SeqPoolingOutput:
        cursor = pooling_metadata.get_pooling_cursor()
        if not cursor.is_partial_prefill() and pooling_metadata.pooling_states is None:
            return list(hidden_states[cursor.first_token_indices_gpu].unbind(0))
        whole = split_finished(hidden_states, pooling_metadata)
        return [None if h is None else h[0] for h in whole]


class LastPool(SequencePoolingMethod):
    """The last prompt token's hidden state (decoder embedders, classifiers)."""

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> SeqPoolingOutput:
        cursor = pooling_metadata.get_pooling_cursor()
        rows = hidden_states[cursor.last_token_indices_gpu]
        finished = cursor.is_finished().tolist()
        return [row if done else None for row, done in zip(rows.unbind(0), finished)]


class MeanPool(SequencePoolingMethod):
    """The mean over every prompt token, accumulated in float32."""

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> SeqPoolingOutput:
        whole = split_finished(hidden_states, pooling_metadata)
        return [None if h is None else h.float().mean(dim=0) for h in whole]


def get_seq_pooling_method(pooling_type: str) -> SequencePoolingMethod:
    if pooling_type == "CLS":
        return CLSPool()
    if pooling_type == "LAST":
        return LastPool()
    if pooling_type == "MEAN":
        return MeanPool()
    if pooling_type in ("ALL", "STEP"):
        raise ValueError(
            f"pooling_type={pooling_type!r} pools token-wise (tasks token_embed / "
            "token_classify, e.g. a reward model: --convert reward); this model's sequence "
            "tasks (embed / classify) need CLS, LAST or MEAN."
        )
    raise NotImplementedError(f"Unknown sequence pooling type: {pooling_type!r}")
