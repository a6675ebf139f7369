"""The V1 runner's pooling step (upstream: `_pool` / `_dummy_pooler_run` of
vllm/v1/worker/gpu_model_runner.py). Pooling models run on the V1 runner
only (the seed's rule); they have no sampler.

After the forward pass the hidden states of the scheduled tokens (request
after request, in batch order) go to `model.pooler` with a PoolingMetadata
built here: per request its prompt length, PoolingParams, how many tokens
ran this step and how many are computed after it, and its PoolingStates
(the hidden states of earlier chunks, for poolers that need the whole
prompt). A request whose prompt is complete after this step gets its tensor
(moved to the CPU); one still mid-prefill gets None and is pooled with its
last chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vllm.pooling_params import PoolingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.pool.metadata import PoolingMetadata, PoolingStates

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig
    from vllm.v1.worker.gpu_input_batch import CachedRequestState


def get_pooler(model: Any) -> Any:
    pooler = getattr(model, "pooler", None)
    if pooler is None:
        raise TypeError(f"{type(model).__name__} has no pooler: not a pooling model.")
    return pooler


def pool_step(
    model: Any,
    hidden_states: torch.Tensor,
    req_ids: list[str],
    requests: dict[str, CachedRequestState],
    pooling_states: dict[str, PoolingStates],
    num_scheduled_tokens: dict[str, int],
    seq_lens: np.ndarray,
) -> ModelRunnerOutput:
    """Run the pooler over one step; the output carries one entry per request."""
    pooler = get_pooler(model)
    params: list[PoolingParams] = []
    for req_id in req_ids:
        p = requests[req_id].pooling_params
        assert p is not None and p.task is not None, f"request {req_id} has no pooling task"
        # What the task's pooler needs set (STEP pooling: the prompt token ids).
        pooler.get_pooling_updates(p.task).apply(p)
        params.append(p)
    metadata = PoolingMetadata(
        prompt_lens=torch.tensor([requests[r].num_prompt_tokens for r in req_ids]),
        prompt_token_ids=_prompt_token_ids(req_ids, requests, params),
        pooling_params=params,
        pooling_states=[pooling_states.setdefault(r, PoolingStates()) for r in req_ids],
    )
    num_sched = [num_scheduled_tokens[r] for r in req_ids]
    metadata.build_pooling_cursor(
        num_sched, torch.from_numpy(seq_lens[: len(req_ids)].copy()), hidden_states.device
    )
    raw = pooler(hidden_states[: sum(num_sched)], metadata)
    pooler_output: list[torch.Tensor | None] = [
        None if out is None else out.detach().to("cpu", copy=True) for out in raw
    ]
    return ModelRunnerOutput(
        req_ids=list(req_ids),
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[[] for _ in req_ids],
        pooler_output=pooler_output,
    )


def _prompt_token_ids(
    req_ids: list[str], requests: dict[str, CachedRequestState], params: list[PoolingParams]
) -> torch.Tensor | None:
    """[num_reqs, max_prompt_len] int64, each row a prompt's token ids padded
    with 0 (PoolingMetadata cuts each to its prompt_len), when a request's
    pooler asked for them (requires_token_ids); else None."""
    if not any(p.requires_token_ids for p in params):
        return None
    prompts = [requests[r].prompt_token_ids for r in req_ids]
    out = torch.zeros(len(prompts), max(len(t) for t in prompts), dtype=torch.int64)
    for row, ids in zip(out, prompts):
        row[: len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out


@torch.inference_mode()
def dummy_pooler_run(model: Any, model_config: ModelConfig, hidden_states: torch.Tensor) -> None:
    """Each supported task's pooler once over the dummy batch as one request
    (upstream's `_dummy_pooler_run`: exercises the heads' buffers)."""
    pooler = get_pooler(model)
    n = hidden_states.shape[0]
    for task in sorted(pooler.get_supported_tasks()):
        params = PoolingParams()
        params.verify(task, None)
        pooler.get_pooling_updates(task).apply(params)
        metadata = PoolingMetadata(
            prompt_lens=torch.tensor([n]),
            prompt_token_ids=torch.zeros(1, n, dtype=torch.int64)
            if params.requires_token_ids
            else None,
            pooling_params=[params],
            pooling_states=[PoolingStates()],
        )
        metadata.build_pooling_cursor([n], torch.tensor([n]), hidden_states.device)
        pooler(hidden_states, metadata)


def supported_pooling_tasks(model: Any) -> tuple[str, ...]:
    return tuple(sorted(get_pooler(model).get_supported_tasks()))


def token_type_ids_for_step(
    req_ids: list[str],
    requests: dict[str, CachedRequestState],
    num_scheduled_tokens: dict[str, int],
    positions: np.ndarray,
    device: torch.device,
) -> torch.Tensor | None:
    """Segment ids of the step's tokens for cross-encoders: a scored pair's
    PoolingParams.extra_kwargs["compressed_token_type_ids"] is the position
    where its second text starts (token_type_ids 1 from there on, as
    upstream). None when no request of the step carries one."""
    starts: list[int] = []
    found = False
    for req_id in req_ids:
        params = requests[req_id].pooling_params
        extra = (params.extra_kwargs or {}) if params is not None else {}
        start = extra.get("compressed_token_type_ids")
        found |= start is not None
        starts.append(int(start) if start is not None else np.iinfo(np.int64).max)
    if not found:
        return None
    counts = [num_scheduled_tokens[r] for r in req_ids]
    per_token_start = np.repeat(np.asarray(starts, dtype=np.int64), counts)
    types = (positions[: per_token_start.shape[0]] >= per_token_start).astype(np.int64)
    return torch.from_numpy(types).to(device)
