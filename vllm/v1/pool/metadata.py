"""What a pooler is told about the requests of one step (upstream:
vllm/v1/pool/metadata.py).

The runner passes the hidden states of the step's scheduled tokens, laid out
request after request, plus a `PoolingMetadata` whose `PoolingCursor` says
where each request's tokens are. Example, two requests, the first prefilled
in two chunks (prompt 5 tokens, 3 computed before this step):
    num_scheduled_tokens_cpu = [2, 4]   prompt_lens_cpu = [5, 4]
    first_token_indices_gpu  = [0, 2]   last_token_indices_gpu = [1, 5]
    seq_lens_cpu             = [5, 4]   (computed + scheduled)
A request is finished (pooled this step) when seq_len == prompt_len; one is
a partial prefill when its scheduled tokens are not its whole prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask


@dataclass
class PoolingCursor:
    index: list[int]
    first_token_indices_gpu: torch.Tensor
    last_token_indices_gpu: torch.Tensor
    prompt_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_scheduled_tokens_cpu: torch.Tensor

    def __getitem__(self, indices: slice) -> PoolingCursor:
        return PoolingCursor(
            index=self.index[indices],
            first_token_indices_gpu=self.first_token_indices_gpu[indices],
            last_token_indices_gpu=self.last_token_indices_gpu[indices],
            prompt_lens_cpu=self.prompt_lens_cpu[indices],
            seq_lens_cpu=self.seq_lens_cpu[indices],
            num_scheduled_tokens_cpu=self.num_scheduled_tokens_cpu[indices],
        )

    def is_partial_prefill(self) -> bool:
        """Whether some request's scheduled tokens are not its whole prompt."""
        return not bool(torch.all(self.prompt_lens_cpu == self.num_scheduled_tokens_cpu))

    def is_finished(self) -> torch.Tensor:
        """[num_reqs] bool: the request's prompt is complete after this step."""
        return self.prompt_lens_cpu == self.seq_lens_cpu


@dataclass
class PoolingStates:
    """Per-request state the runner keeps across steps: the hidden states of
    the chunks already run, for token-level (ALL) pooling under chunked
    prefill."""

    hidden_states_cache: list[torch.Tensor] = field(default_factory=list)

    def clean(self) -> None:
        self.hidden_states_cache.clear()


@dataclass
class PoolingMetadata:
    """Tensors for pooling: per request its prompt length, parameters and
    (when a pooler asks for them) prompt token ids."""

    prompt_lens: torch.Tensor  # [num_reqs] int64, CPU
    prompt_token_ids: torch.Tensor | None  # [num_reqs, max_prompt_len], padded
    pooling_params: list[PoolingParams]
    pooling_cursor: PoolingCursor | None = None
    pooling_states: list[PoolingStates] | None = None

    def __post_init__(self) -> None:
        tasks: list[PoolingTask] = []
        for params in self.pooling_params:
            assert params.task is not None, "PoolingParams.verify() has not run"
            tasks.append(params.task)
        self.tasks = tasks

    def __getitem__(self, indices: slice) -> PoolingMetadata:
        return PoolingMetadata(
            prompt_lens=self.prompt_lens[indices],
            prompt_token_ids=(
                None if self.prompt_token_ids is None else self.prompt_token_ids[indices]
            ),
            pooling_params=self.pooling_params[indices],
            pooling_cursor=None if self.pooling_cursor is None else self.pooling_cursor[indices],
            pooling_states=None if self.pooling_states is None else self.pooling_states[indices],
        )

    def get_pooling_cursor(self) -> PoolingCursor:
        assert self.pooling_cursor is not None, "build_pooling_cursor() has not run"
        return self.pooling_cursor

    def get_prompt_token_ids(self) -> list[torch.Tensor]:
        assert self.prompt_token_ids is not None, (
            "Please set `requires_token_ids=True` in `get_pooling_updates`"
        )
        return [t[:n] for t, n in zip(self.prompt_token_ids, self.prompt_lens.tolist())]

    def build_pooling_cursor(
        self, num_scheduled_tokens: list[int], seq_lens_cpu: torch.Tensor, device: torch.device
    ) -> None:
        n_sched = torch.tensor(num_scheduled_tokens, dtype=torch.int64)
        assert len(n_sched) == len(self.prompt_lens)
        cumsum = torch.cumsum(n_sched, dim=0)
        first = (cumsum - n_sched).to(device, non_blocking=True)
        self.pooling_cursor = PoolingCursor(
            index=list(range(len(n_sched))),
            first_token_indices_gpu=first,
            last_token_indices_gpu=(cumsum - 1).to(device, non_blocking=True),
            prompt_lens_cpu=self.prompt_lens,
            seq_lens_cpu=seq_lens_cpu.to(torch.int64),
            num_scheduled_tokens_cpu=n_sched,
        )

    def with_cursor(self, cursor: PoolingCursor) -> PoolingMetadata:
        return replace(self, pooling_cursor=cursor)
