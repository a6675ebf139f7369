"""DispatchPooler: a sub-pooler per task (upstream:
vllm/model_executor/layers/pooler/special.py)."""

from __future__ import annotations

from collections.abc import Mapping, Set
from itertools import groupby

import torch

from vllm.config.pooler import PoolerConfig
from vllm.model_executor.layers.pooler.abstract import Pooler, PoolerOutput
from vllm.model_executor.layers.pooler.activations import PoolerActivation
from vllm.model_executor.layers.pooler.common import ClassifierFn, PoolingParamsUpdate
from vllm.tasks import PoolingTask
from vllm.v1.pool.metadata import PoolingMetadata

from .seqwise import SequencePoolingFn, SequencePoolingMethod, pooler_for_classify, pooler_for_embed
from .tokwise import pooler_for_token_classify, pooler_for_token_embed


class DispatchPooler(Pooler):
    """Dispatches each run of same-task requests to that task's pooler.

    The runner orders nothing by task: consecutive requests of one task form
    a group; a group's tokens are sliced out of the hidden states and its
    cursor re-based on the slice.
    """

    @classmethod
    def for_embedding(cls, pooler_config: PoolerConfig) -> DispatchPooler:
        """embed (pooling_type's row, normalised) and token_embed (ALL)."""
        return cls(
            {
                "token_embed": pooler_for_token_embed(pooler_config),
                "embed": pooler_for_embed(pooler_config),
            }
        )

    @classmethod
    def for_seq_cls(
        cls,
        pooler_config: PoolerConfig,
        *,
        pooling: SequencePoolingMethod | SequencePoolingFn | None = None,
        classifier: ClassifierFn | None = None,
        act_fn: PoolerActivation | None = None,
    ) -> DispatchPooler:
        """classify (the classifier over pooling_type's row; a one-label
        classifier also scores text pairs) and token_classify (the classifier
        over every token)."""
        seq = pooler_for_classify(
            pooler_config, pooling=pooling, classifier=classifier, act_fn=act_fn
        )
        return cls(
            {
                "token_classify": pooler_for_token_classify(
                    pooler_config, classifier=classifier, act_fn=act_fn
                ),
                "classify": seq,
            }
        )

    def __init__(self, poolers_by_task: Mapping[PoolingTask, Pooler]) -> None:
        super().__init__()
        for task, pooler in poolers_by_task.items():
            if task not in pooler.get_supported_tasks():
                raise ValueError(
                    f"{pooler=} does not support {task=}. "
                    f"Supported tasks: {pooler.get_supported_tasks()}"
                )
        self.poolers_by_task = dict(poolers_by_task)
        # Registered once each, so .to() / state_dict see every sub-pooler.
        unique: dict[int, Pooler] = {id(p): p for p in poolers_by_task.values()}
        self._poolers = torch.nn.ModuleList(unique.values())

    def get_supported_tasks(self) -> Set[PoolingTask]:
        return set(self.poolers_by_task)

    def get_pooling_updates(self, task: PoolingTask) -> PoolingParamsUpdate:
        return self.poolers_by_task[task].get_pooling_updates(task)

    def forward(
        self, hidden_states: torch.Tensor, pooling_metadata: PoolingMetadata
    ) -> PoolerOutput:
        cursor = pooling_metadata.get_pooling_cursor()
        outputs: list[torch.Tensor | None] = []
        offset = token_offset = 0
        for task, group in groupby(pooling_metadata.tasks):
            pooler = self.poolers_by_task.get(task)
            if pooler is None:
                raise ValueError(
                    f"Unsupported task: {task!r} Supported tasks: {self.get_supported_tasks()}"
                )
            n = len(list(group))
            meta = pooling_metadata[offset : offset + n]
            group_cursor = cursor[offset : offset + n]
            n_tokens = int(group_cursor.num_scheduled_tokens_cpu.sum())
            group_cursor.first_token_indices_gpu = (
                group_cursor.first_token_indices_gpu - token_offset
            )
            group_cursor.last_token_indices_gpu = group_cursor.last_token_indices_gpu - token_offset
            meta = meta.with_cursor(group_cursor)
            group_out = pooler(hidden_states[token_offset : token_offset + n_tokens], meta)
            outputs.extend(group_out)
            offset += n
            token_offset += n_tokens
        return outputs

    def extra_repr(self) -> str:
        return f"supported_task={self.get_supported_tasks()}"
