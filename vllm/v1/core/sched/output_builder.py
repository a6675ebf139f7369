"""Builders of the scheduler's messages: the per-request parts of a
`SchedulerOutput` (to the workers) and the `EngineCoreOutputs` (to the
front-ends). Pure functions of their arguments; the `Scheduler` supplies its
state."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from vllm.v1.core.sched.output import CachedRequestData, NewRequestData
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.request import Request


def make_new_reqs_data(
    new_reqs: list[Request],
    resumed_reqs: list[Request],
    req_to_new_blocks: dict[str, KVCacheBlocks],
    use_v2_model_runner: bool,
) -> tuple[list[NewRequestData], list[Request]]:
    """NewRequestData of the admitted requests, and the resumed requests that
    go to CachedRequestData instead.

    Model Runner V2 treats a preemption like a finish: a resumed request is
    sent again as a new one, with prefill_token_ids = the prompt plus every
    token generated so far (V2 passes prefill_token_ids for every new
    request). The V1 runner keeps resumed requests among the cached ones.
    """
    if not use_v2_model_runner:
        data = [
            NewRequestData.from_request(req, req_to_new_blocks[req.request_id].get_block_ids())
            for req in new_reqs
        ]
        return data, resumed_reqs
    data = [
        # A copy: the request keeps appending to its own list.
        NewRequestData.from_request(
            req,
            req_to_new_blocks[req.request_id].get_block_ids(),
            prefill_token_ids=req.all_token_ids.copy(),
        )
        for req in itertools.chain(new_reqs, resumed_reqs)
    ]
    return data, []


def make_cached_request_data(
    running_reqs: list[Request],
    resumed_reqs: list[Request],
    num_scheduled_tokens: dict[str, int],
    spec_decode_tokens: dict[str, list[int]],
    req_to_new_blocks: dict[str, KVCacheBlocks],
    prev_step_scheduled_req_ids: set[str],
    use_pp: bool,
    use_v2_model_runner: bool,
) -> CachedRequestData:
    """Diffs for the requests the workers already hold: running requests,
    then (V1 runner) resumed ones."""
    data = CachedRequestData.make_empty()
    for idx, req in enumerate(itertools.chain(running_reqs, resumed_reqs)):
        req_id = req.request_id
        data.req_ids.append(req_id)
        if use_pp:
            # Without pipeline parallelism the runner remembers the tokens it
            # sampled; with it, the first stage never saw them.
            num_tokens = num_scheduled_tokens[req_id] - len(spec_decode_tokens.get(req_id, ()))
            start = req.num_computed_tokens
            data.new_token_ids.append(list(req.all_token_ids[start : start + num_tokens]))
        scheduled_in_prev_step = req_id in prev_step_scheduled_req_ids
        if idx >= len(running_reqs):
            # Preempted in an earlier step, so absent from the previous one.
            assert not scheduled_in_prev_step
            data.resumed_req_ids.add(req_id)
        if not use_v2_model_runner and not scheduled_in_prev_step:
            # The V1 runner drops a request from its persistent batch in a
            # step that skips it: send all its tokens again.
            data.all_token_ids[req_id] = list(req.all_token_ids)
        # Resumed (V1): every block of the request; it replaces the old list.
        data.new_block_ids.append(req_to_new_blocks[req_id].get_block_ids(allow_none=True))
        data.num_computed_tokens.append(req.num_computed_tokens)
        data.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
    return data


def make_engine_core_outputs(
    outputs: dict[int, list[EngineCoreOutput]],
    finished_req_ids_dict: dict[int, set[str]] | None,
    scheduler_stats: SchedulerStats | None,
) -> dict[int, EngineCoreOutputs]:
    """Group a step's request outputs by client (front-end) index.

    `finished_req_ids_dict` (include_finished_set) adds, per client, the ids
    finished since the last call, and is emptied. The stats go to one client
    only, even in a step without any output.
    """
    engine_core_outputs = {
        client_index: EngineCoreOutputs(outputs=outs) for client_index, outs in outputs.items()
    }
    if finished_req_ids_dict:
        for client_index, finished in finished_req_ids_dict.items():
            eco = engine_core_outputs.get(client_index)
            if eco is None:
                eco = engine_core_outputs[client_index] = EngineCoreOutputs()
            eco.finished_requests = finished
        finished_req_ids_dict.clear()
    if scheduler_stats is not None:
        eco = next(iter(engine_core_outputs.values()), None)
        if eco is None:
            eco = engine_core_outputs[0] = EngineCoreOutputs()
        eco.scheduler_stats = scheduler_stats
    return engine_core_outputs
