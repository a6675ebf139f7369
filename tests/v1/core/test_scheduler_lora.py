"""The scheduler with LoRA (issue 18 item 1): every step needs at most
`max_loras` adapter slots (running requests first; a waiting request whose
adapter would exceed the bound steps aside, keeping its place, while later
requests may still be admitted), and prefix-cache blocks are keyed by the
adapter (name and id), so the same prompt under two adapters shares no block."""

from __future__ import annotations

import random
from collections import deque

import pytest

from tests.v1.core.scheduler_utils import (
    EOS_TOKEN_ID,
    create_scheduler,
    make_model_runner_output,
)
from vllm.config import LoRAConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

ADAPTERS = {name: LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("ABCD", 1)}


def _request(
    req_id: str,
    adapter: str | LoRARequest | None,
    num_tokens: int = 10,
    max_tokens: int = 16,
    prompt: list[int] | None = None,
) -> Request:
    """As scheduler_utils.make_request, with the adapter set at construction
    (the block hashes, computed there, include its name)."""
    init_none_hash(sha256)
    lora = ADAPTERS[adapter] if isinstance(adapter, str) else adapter
    return Request(
        request_id=req_id,
        prompt_token_ids=list(prompt if prompt is not None else [int(req_id)] * num_tokens),
        sampling_params=SamplingParams(max_tokens=max_tokens),
        eos_token_id=EOS_TOKEN_ID,
        lora_request=lora,
        block_hasher=get_request_block_hasher(16, sha256),
    )


def _scheduler(max_loras: int = 2, **kwargs) -> Scheduler:
    return create_scheduler(lora_config=LoRAConfig(max_loras=max_loras), **kwargs)


def _step(scheduler: Scheduler) -> tuple[list[str], set[int]]:
    """One step; returns (scheduled request ids, their distinct adapter ids)."""
    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    loras = {
        r.lora_request.lora_int_id
        for r in (scheduler.requests[i] for i in ids)
        if r.lora_request is not None
    }
    scheduler.update_from_output(out, make_model_runner_output(scheduler, out))
    return ids, loras


def test_lora_request_refused_without_lora_config():
    scheduler = create_scheduler()
    with pytest.raises(ValueError, match="but LoRA is not enabled!"):
        scheduler.add_request(_request("0", "A"))
    assert not scheduler.requests


def test_third_adapter_waits_and_keeps_its_place():
    scheduler = _scheduler(max_loras=2)
    # "2" (adapter C) is the third adapter: it steps aside; "3" (A again) and
    # "4" (the base model) are admitted behind it in the same step.
    plan = [("0", "A", 2), ("1", "B", 6), ("2", "C", 3), ("3", "A", 2), ("4", None, 6)]
    for req_id, adapter, max_tokens in plan:
        scheduler.add_request(_request(req_id, adapter, max_tokens=max_tokens))
    ids, loras = _step(scheduler)
    assert ids == ["0", "1", "3", "4"] and loras == {1, 2}
    assert [r.request_id for r in scheduler.waiting] == ["2"]
    ids, _ = _step(scheduler)  # A's two requests finish with their 2nd token
    assert "2" not in ids and not {"0", "3"} & set(scheduler.requests)
    ids, loras = _step(scheduler)  # A's slot is free: C is admitted
    assert ids == ["1", "4", "2"] and loras == {2, 3}
    assert not scheduler.waiting


def test_same_adapter_never_waits():
    scheduler = _scheduler(max_loras=1)
    for i in range(4):
        scheduler.add_request(_request(str(i), "A"))
    ids, loras = _step(scheduler)
    assert ids == ["0", "1", "2", "3"] and loras == {1}


@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_every_step_within_max_loras_and_every_request_finishes(max_loras):
    # Four adapters and base requests, a KV cache small enough to preempt.
    rng = random.Random(max_loras)
    scheduler = _scheduler(max_loras=max_loras, num_blocks=24, max_num_batched_tokens=96)
    adapters = [None, "A", "B", "C", "D"]
    for i in range(40):
        adapter = rng.choice(adapters)
        scheduler.add_request(
            _request(str(i), adapter, num_tokens=rng.randint(4, 40), max_tokens=rng.randint(1, 12))
        )
    num_steps, preempted = 0, False
    while scheduler.has_unfinished_requests():
        _, loras = _step(scheduler)
        assert len(loras) <= max_loras
        running = {r.lora_request.name for r in scheduler.running if r.lora_request}
        assert len(running) <= max_loras
        preempted |= any(r.num_preemptions for r in scheduler.waiting)
        num_steps += 1
        assert num_steps < 1000, "requests starved"
    assert preempted  # the bound held across preemptions too


def _prefill(scheduler: Scheduler, req_id: str, adapter: str | None, prompt: list[int]) -> int:
    """Admit one request alone; returns its prefix-cache hit in tokens."""
    scheduler.add_request(_request(req_id, adapter, prompt=prompt, max_tokens=1))
    out = scheduler.schedule()
    (new_req,) = out.scheduled_new_reqs
    scheduler.update_from_output(out, make_model_runner_output(scheduler, out))
    return new_req.num_computed_tokens


def test_prefix_cache_blocks_are_keyed_by_adapter():
    scheduler = _scheduler(max_loras=2, enable_prefix_caching=True)
    prompt = list(range(40))  # 2 full blocks of 16 + 8 tokens
    assert _prefill(scheduler, "a1", "A", prompt) == 0
    assert _prefill(scheduler, "b1", "B", prompt) == 0  # another adapter: no hit
    assert _prefill(scheduler, "base", None, prompt) == 0  # the base model: no hit
    assert _prefill(scheduler, "a2", "A", prompt) == 32  # the same adapter: both blocks
    assert _prefill(scheduler, "b2", "B", prompt) == 32
    assert _prefill(scheduler, "base2", None, prompt) == 32


def test_block_hashes_differ_by_adapter_name_and_id():
    prompt = list(range(32))
    a = _request("a", "A", prompt=prompt).block_hashes
    b = _request("b", "B", prompt=prompt).block_hashes
    base = _request("c", None, prompt=prompt).block_hashes
    assert len(a) == len(b) == len(base) == 2
    assert not set(a) & set(b) and not set(a) & set(base)
    # Keyed by name and id: the same name loaded again (another id, maybe
    # other weights) shares no block; the same adapter again shares them all.
    assert not set(a) & set(_request("d", LoRARequest("A", 9, "/a-v2"), prompt=prompt).block_hashes)
    assert _request("e", LoRARequest("A", 1, "/adapters/A"), prompt=prompt).block_hashes == a


def test_async_scheduling_two_steps_in_flight_stay_within_max_loras():
    """The engine core's batch queue of two: step N + 1 is scheduled before
    step N's tokens are known, so a running request whose steps in flight
    already reach max_tokens is left out of a step. Its adapter still counts:
    no later step may need more than max_loras slots."""
    scheduler = _scheduler(max_loras=2, async_scheduling=True)
    rng = random.Random(0)
    for i in range(30):
        adapter = rng.choice([None, "A", "B", "C", "D"])
        scheduler.add_request(_request(str(i), adapter, max_tokens=rng.randint(1, 4)))

    def schedule():
        out = scheduler.schedule()
        loras = {
            scheduler.requests[r].lora_request.lora_int_id
            for r in out.num_scheduled_tokens
            if scheduler.requests[r].lora_request is not None
        }
        assert len(loras) <= 2
        return out, make_model_runner_output(scheduler, out)

    in_flight = deque([schedule(), schedule()])
    while in_flight:
        out, runner_output = in_flight.popleft()
        scheduler.update_from_output(out, runner_output)
        out, runner_output = schedule()
        if out.num_scheduled_tokens:
            in_flight.append((out, runner_output))
    assert not scheduler.has_unfinished_requests()
