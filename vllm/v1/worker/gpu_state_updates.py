"""Request-state updates of the V1 model runner (upstream: `_update_states`
and its helpers in vllm/v1/worker/gpu_model_runner.py, which keeps
`GPUModelRunner._update_states` as the step's entry point).

Each step the scheduler sends diffs, not whole requests: new requests come
with their prompt and blocks, cached (already known) ones with their new
blocks and computed-token count, finished ones by id. These functions apply
them to the runner's `CachedRequestState`s (`requests`, by request id) and to
the persistent `InputBatch`; the runner then condenses and reorders the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from vllm.sampling_params import SamplingType
from vllm.v1.pool.metadata import PoolingStates
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.prompt_logprobs import PromptLogprobsWorker

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput


def remove_stale_requests(
    scheduler_output: SchedulerOutput,
    batch: InputBatch,
    requests: dict[str, CachedRequestState],
    pooling_states: dict[str, PoolingStates],
    prompt_logprobs_worker: PromptLogprobsWorker,
) -> None:
    """Finished requests are forgotten; requests in the batch but not
    scheduled now (preempted, or left out this step) leave the batch and keep
    their `CachedRequestState`. A resumed request leaves it too: it is re-added
    with its new block ids."""
    for req_id in scheduler_output.finished_req_ids:
        requests.pop(req_id, None)
        pooling_states.pop(req_id, None)
        prompt_logprobs_worker.remove_request(req_id)
        batch.remove_request(req_id)

    cached = scheduler_output.scheduled_cached_reqs
    scheduled = scheduler_output.num_scheduled_tokens.keys()
    for req_id in list(batch.req_id_to_index):
        if req_id not in scheduled or req_id in cached.resumed_req_ids:
            batch.remove_request(req_id)


def add_new_request(
    new_req: NewRequestData,
    requests: dict[str, CachedRequestState],
    prompt_logprobs_worker: PromptLogprobsWorker,
    device: torch.device,
) -> CachedRequestState:
    """The state of a new generation request (a seeded one gets its own
    generator on `device`), registered in `requests`."""
    params = new_req.sampling_params
    if params is None:
        raise ValueError(f"Request {new_req.req_id} has neither sampling nor pooling params.")
    if new_req.prompt_token_ids is None:
        raise ValueError(
            f"Request {new_req.req_id} has no prompt token ids; prompt "
            "embeddings are not supported."
        )
    generator = None
    if params.sampling_type == SamplingType.RANDOM_SEED:
        generator = torch.Generator(device=device)
        assert params.seed is not None  # what makes it RANDOM_SEED
        generator.manual_seed(params.seed)
    req_state = CachedRequestState(
        req_id=new_req.req_id,
        prompt_token_ids=new_req.prompt_token_ids,
        mm_features=new_req.mm_features,
        sampling_params=params,
        generator=generator,
        block_ids=tuple(list(ids) for ids in new_req.block_ids),
        num_computed_tokens=new_req.num_computed_tokens,
        output_token_ids=[],
        lora_request=new_req.lora_request,
    )
    requests[new_req.req_id] = req_state
    prompt_logprobs_worker.add_request(new_req.req_id, new_req.prompt_token_ids, params)
    return req_state


def add_new_pooling_request(
    new_req: NewRequestData,
    requests: dict[str, CachedRequestState],
    pooling_states: dict[str, PoolingStates],
    is_pooling_model: bool,
) -> CachedRequestState:
    """The state of a new pooling request (a pooling model's only kind)."""
    if not is_pooling_model:
        raise ValueError(f"Request {new_req.req_id}: pooling params for a generative model.")
    if new_req.prompt_token_ids is None:
        raise ValueError(f"Request {new_req.req_id} has no prompt token ids.")
    req_state = CachedRequestState(
        req_id=new_req.req_id,
        prompt_token_ids=new_req.prompt_token_ids,
        mm_features=new_req.mm_features,
        sampling_params=None,
        generator=None,
        block_ids=tuple(list(ids) for ids in new_req.block_ids),
        num_computed_tokens=new_req.num_computed_tokens,
        output_token_ids=[],
        lora_request=new_req.lora_request,
        pooling_params=new_req.pooling_params,
    )
    requests[new_req.req_id] = req_state
    pooling_states[new_req.req_id] = PoolingStates()
    return req_state


def update_cached_requests(
    scheduler_output: SchedulerOutput,
    batch: InputBatch,
    requests: dict[str, CachedRequestState],
    pooling_states: dict[str, PoolingStates],
    correct_num_computed: Callable[[str, int], int] | None = None,
) -> list[CachedRequestState]:
    """Apply the per-request diffs; returns the states that must (re)join
    the batch (resumed, or not scheduled in the previous step).
    `correct_num_computed(req_id, n)` (async scheduling with speculative
    decoding, vllm/v1/worker/async_spec_decode.py): the real computed-token
    count of a request that stays in the batch, the scheduler's n counting
    the previous step's drafts as accepted."""
    data = scheduler_output.scheduled_cached_reqs
    to_add: list[CachedRequestState] = []
    for i, req_id in enumerate(data.req_ids):
        req_state = requests[req_id]
        num_computed = data.num_computed_tokens[i]
        new_block_ids = data.new_block_ids[i]
        row = batch.req_id_to_index.get(req_id)
        if correct_num_computed is not None and row is not None:
            num_computed = correct_num_computed(req_id, num_computed)
        req_state.num_computed_tokens = num_computed

        num_output_tokens = data.num_output_tokens[i]
        if num_output_tokens < len(req_state.output_token_ids):
            # The scheduler dropped tokens we hold (e.g. a failed KV load).
            del req_state.output_token_ids[num_output_tokens:]
            if row is not None:
                batch.num_tokens[row] = req_state.num_tokens

        if req_id in data.resumed_req_ids:
            assert row is None and new_block_ids is not None
            req_state.block_ids = tuple(list(ids) for ids in new_block_ids)
            if req_id in pooling_states:
                # Preempted: its prompt is recomputed, so are the chunks kept.
                pooling_states[req_id].clean()
        elif new_block_ids is not None:
            for block_ids, new_ids in zip(req_state.block_ids, new_block_ids):
                block_ids.extend(new_ids)

        if row is None:
            all_token_ids = data.all_token_ids.get(req_id)
            if all_token_ids is not None:
                req_state.output_token_ids[:] = all_token_ids[req_state.num_prompt_tokens :]
            to_add.append(req_state)
            continue
        batch.num_computed_tokens_cpu[row] = num_computed
        if new_block_ids is not None:
            batch.block_table.append_row(new_block_ids, row)
    return to_add
