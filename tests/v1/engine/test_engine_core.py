"""EngineCore driven directly: KV sizing, add / step / abort, the prefix cache
(upstream: tests/v1/engine/test_engine_core.py)."""

from __future__ import annotations

import time

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreRequest, FinishReason
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.abstract import Executor

KV_BYTES = 4 * 2**20


@pytest.fixture(scope="module")
def core(tiny_model_dir):
    config = EngineArgs(
        model=tiny_model_dir("qwen3"),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=KV_BYTES,
    ).create_engine_config()
    engine_core = EngineCore(config, Executor.get_class(config), log_stats=True)
    yield engine_core
    engine_core.shutdown()


def _request(req_id: str, prompt: list[int], max_tokens: int) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=req_id,
        prompt_token_ids=prompt,
        mm_features=None,
        sampling_params=SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        eos_token_id=0,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
    )


def _add(core: EngineCore, request: EngineCoreRequest) -> None:
    req, wave = core.preprocess_add_request(request)
    core.add_request(req, wave)


def _run(core: EngineCore, max_steps: int = 200) -> dict[str, list[int]]:
    """Step until idle; token ids and finish reasons per request."""
    tokens: dict[str, list[int]] = {}
    finished: dict[str, FinishReason] = {}
    for _ in range(max_steps):
        outputs, _ = core.step()
        if not outputs:
            break
        for out in outputs[0].outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finish_reason is not None:
                finished[out.request_id] = out.finish_reason
    assert set(finished) == set(tokens)
    return tokens


def test_kv_cache_is_sized_from_the_byte_budget(core):
    config = core.vllm_config
    model = config.model_config
    # K and V per layer per token: 2 * kv_heads * head_size * 4 bytes (float32).
    bytes_per_block = (
        2
        * model.get_num_kv_heads(config.parallel_config)
        * model.get_head_size()
        * 4
        * config.cache_config.block_size
        * model.get_num_layers(config.parallel_config)
    )
    assert config.cache_config.num_gpu_blocks == KV_BYTES // bytes_per_block


def test_add_step_finish_and_idle(core):
    assert core.step() == ({}, False)
    _add(core, _request("a", [1, 2, 3, 4, 5], 6))
    _add(core, _request("b", list(range(10, 40)), 3))
    tokens = _run(core)
    assert {k: len(v) for k, v in tokens.items()} == {"a": 6, "b": 3}
    assert not core.scheduler.has_requests()
    assert core.step() == ({}, False)


def test_greedy_is_deterministic_and_prefix_cache_resets(core):
    _add(core, _request("x1", list(range(3, 40)), 5))
    first = _run(core)["x1"]
    _add(core, _request("x2", list(range(3, 40)), 5))  # the same prompt, from the cache
    assert _run(core)["x2"] == first
    assert core.reset_prefix_cache() is True


def test_abort(core):
    _add(core, _request("long", [7] * 8, 50))
    _add(core, _request("short", [8] * 8, 2))
    core.step()
    core.abort_requests(["long", "no-such-request"])
    tokens = _run(core)
    assert len(tokens.get("short", [])) <= 2
    assert not core.scheduler.has_requests()


def test_duplicate_request_id_is_rejected(core):
    _add(core, _request("dup", [1, 2], 4))
    with pytest.raises(ValueError):
        _add(core, _request("dup", [1, 2], 4))
    core.abort_requests(["dup"])
    _run(core)
