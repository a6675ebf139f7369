"""Which hidden states make a request's rows, token-wise (upstream:
vllm/model_executor/layers/pooler/tokwise/methods.py).

ALL: every prompt token's hidden state, [prompt_len, hidden]. STEP (process
reward models, e.g. math-shepherd): ALL, then only the columns listed in
`returned_token_ids` (when given) and only the rows of the prompt tokens
equal to `step_tag_id` (when given), so [num_step_tags, len(returned)].
Both come with the prompt's last chunk; earlier chunks wait in the request's
PoolingStates (`split_finished`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Set

import torch
import torch.nn as nn

from vllm.model_executor.layers.pooler.common import PoolingParamsUpdate
from vllm.model_executor.layers.pooler.seqwise.methods import split_finished
from vllm.tasks import PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

TokOutput = list[torch.Tensor | None]
# Token-wise pooling types (the others, CLS / LAST / MEAN, are sequence-wise).
TOK_POOLING_TYPES: tuple[str, ...] = ("ALL", "STEP")


class TokenPoolingMethod(nn.Module, ABC):
    def get_supported_tasks(self) -> Set[PoolingTask]:
        return {"token_embed", "token_classify"}

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        return PoolingParamsUpdate()

    @abstractmethod
    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> TokOutput:
        raise NotImplementedError


class AllPool(TokenPoolingMethod):
    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> TokOutput:
        return split_finished(hidden_states, pooling_metadata)


class StepPool(AllPool):
    """ALL, then the step-tag rows and the `returned_token_ids` columns of
    each request (its PoolingParams carry both; they need its prompt token
    ids, which the runner passes when `requires_token_ids` is set)."""

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        return PoolingParamsUpdate(requires_token_ids=True)

    def forward(self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata) -> TokOutput:
        rows = super().forward(hidden_states, pooling_metadata)
        token_ids = pooling_metadata.get_prompt_token_ids()
        out: TokOutput = []
        for data, ids, params in zip(rows, token_ids, pooling_metadata.pooling_params):
            if data is None:  # mid-prefill
                out.append(None)
                continue
            if params.returned_token_ids:
                data = data[:, params.returned_token_ids]
            if params.step_tag_id is not None:
                data = data[(ids == params.step_tag_id).to(data.device)]
            out.append(data)
        return out


def get_tok_pooling_method(pooling_type: str) -> TokenPoolingMethod:
    if pooling_type == "ALL":
        return AllPool()
    if pooling_type == "STEP":
        return StepPool()
    raise NotImplementedError(f"Unknown tokenwise pooling type: {pooling_type!r}")
