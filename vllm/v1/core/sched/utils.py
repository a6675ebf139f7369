"""Helpers of the scheduler: the stop check, fast list removal, which
structured-output requests sample in a step, the max_loras admission rule and
the choice of a preemption victim."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, TypeVar

from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.request import RequestStatus

if TYPE_CHECKING:
    from vllm.config import LoRAConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

_T = TypeVar("_T")


def remove_all(lst: list[_T], items_to_remove: set[_T]) -> list[_T]:
    """Remove every element of `items_to_remove` from `lst`.

    Removing one item (the common case: one request finished) is done in
    place; several items build a new list. Callers must use the returned
    list either way.
    """
    if not items_to_remove:
        return lst
    if len(items_to_remove) == 1:
        (item,) = items_to_remove
        with contextlib.suppress(ValueError):
            lst.remove(item)
        return lst
    return [item for item in lst if item not in items_to_remove]


def _eos_token_id(request: Request, sampling_params: SamplingParams) -> int | None:
    # The engine puts the tokenizer's EOS on the request; requests built
    # without one fall back to the id the sampling params learnt from the
    # generation config.
    if request.eos_token_id is not None:
        return request.eos_token_id
    return sampling_params.eos_token_id


def check_stop(request: Request, max_model_len: int) -> bool:
    """Decide whether `request` stops after its newest output token.

    Sets `request.status` (and `request.stop_reason` for a stop token id) and
    returns True when it does. In order:

    1. Fewer than `min_tokens` outputs -> no stop. (One exception of ours:
       upstream lets min_tokens suppress the context-window cap too, which
       leaves a request that cannot fit its min_tokens stuck forever; we
       still cap it at max_model_len.)
    2. EOS (unless `ignore_eos`) -> FINISHED_STOPPED, stop_reason None.
    3. A `stop_token_ids` member -> FINISHED_STOPPED, stop_reason = the id.
    4. `num_tokens >= max_model_len` or `num_output_tokens >= max_tokens`
       -> FINISHED_LENGTH_CAPPED.

    Stop strings are not checked here: the frontend detokenizes, finds them
    and aborts the request.
    """
    sampling_params = request.sampling_params
    assert sampling_params is not None, "pooling requests have no stop check"

    if request.num_output_tokens < sampling_params.min_tokens:
        if request.num_tokens >= max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    last_token_id = request.output_token_ids[-1]
    if not sampling_params.ignore_eos and last_token_id == _eos_token_id(request, sampling_params):
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last_token_id in (sampling_params.stop_token_ids or ()):
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def structured_output_req_ids_to_sample(
    requests: dict[str, Request], scheduler_output: SchedulerOutput
) -> list[str]:
    """The scheduled structured-output requests that sample a token in this
    step, in scheduling order; a request in a partial prefill chunk does not.

    Right after scheduling, a request that samples has computed every known
    token, plus (async scheduling) each in-flight token but the one this step
    samples: num_computed_tokens == num_tokens + max(placeholders - 1, 0).
    The equality holds whether or not the earlier steps' outputs are in
    (each one moves a token from placeholder to known); a mid-prefill chunk
    stays below num_tokens and has no placeholders.
    """
    req_ids = []
    for req_id in scheduler_output.num_scheduled_tokens:
        request = requests.get(req_id)
        if request is None or not request.use_structured_output:
            continue
        in_flight = max(request.num_output_placeholders - 1, 0)
        if request.num_computed_tokens >= request.num_tokens + in_flight:
            req_ids.append(req_id)
    return req_ids


def running_lora_ids(running: list[Request], lora_config: LoRAConfig | None) -> set[int]:
    """The adapters of the running requests. Admission keeps them at most
    max_loras, so every step, whichever running requests it schedules,
    needs at most max_loras adapter slots on the workers. (Upstream counts
    only the running requests scheduled in this step; the two differ only
    for a request left out of a step because its steps in flight already
    end it (async scheduling): here its adapter keeps its slot until then.)"""
    if lora_config is None:
        return set()
    loras = {r.lora_request.lora_int_id for r in running if r.lora_request is not None}
    assert len(loras) <= lora_config.max_loras
    return loras


def exceeds_max_loras(
    request: Request, running_loras: set[int], lora_config: LoRAConfig | None
) -> bool:
    """Whether admitting `request` would need one adapter slot too many."""
    lora = request.lora_request
    return (
        lora is not None
        and lora_config is not None
        and lora.lora_int_id not in running_loras
        and len(running_loras) >= lora_config.max_loras
    )


def pop_preemption_victim(running: list[Request], policy: SchedulingPolicy) -> Request:
    """Remove and return the running request to preempt: the one of lowest
    priority (largest (priority, arrival_time)) under the priority policy,
    else the most recently admitted one."""
    if policy == SchedulingPolicy.PRIORITY:
        victim = max(running, key=lambda r: (r.priority, r.arrival_time))
        running.remove(victim)
        return victim
    return running.pop()
