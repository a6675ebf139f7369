"""Greedy parity with transformers' own `generate` on tiny random models,
through the whole engine (scheduler, paged KV cache, model runner), under
both model runners, each with async scheduling on and off, with prefix caching
on and off, forced chunked prefill, and forced preemption."""

from __future__ import annotations

import random

import pytest

from tests.conftest import TINY_KINDS
from tests.models.zoo_utils import spy_preemptions
from tests.utils import hf_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

MAX_TOKENS = 32
PROMPT_LENS = (5, 9, 17, 23, 33, 40, 47, 63)

# Engine settings per mode. "preempt" gives the cache 12 blocks of 16 tokens
# for 8 requests that need ~5 blocks each, so requests must be preempted and
# recomputed; "chunked" caps a step at 16 tokens, so every prompt longer than
# that is prefilled in chunks.
MODES = {
    "prefix_cache": dict(enable_prefix_caching=True),
    "no_prefix_cache": dict(enable_prefix_caching=False),
    "chunked": dict(max_num_batched_tokens=16, max_num_seqs=8, enable_prefix_caching=True),
    "preempt": dict(num_gpu_blocks_override=12, max_num_seqs=8, enable_prefix_caching=True),
}


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(1, 512) for _ in range(32)]  # a 2-block common prefix
    prompts = []
    for i, n in enumerate(PROMPT_LENS):
        own = [rng.randrange(1, 512) for _ in range(n)]
        prompts.append((shared + own)[:n] if i % 2 and n > 32 else own)
    return prompts


_HF_CACHE: dict[str, list[list[int]]] = {}


def _expected(model_dir: str, kind: str) -> list[list[int]]:
    if kind not in _HF_CACHE:
        _HF_CACHE[kind] = hf_greedy(model_dir, _prompts(), MAX_TOKENS)
    return _HF_CACHE[kind]


def _spy_batches_in_flight(llm: LLM) -> list[int]:
    """Record the batch queue's length after each engine-core step."""
    core = llm.llm_engine.engine_core.engine_core
    lengths: list[int] = []
    real = core.step_fn

    def spy():
        result = real()
        lengths.append(len(core.batch_queue or ()))
        return result

    core.step_fn = spy
    return lengths


# (runner env value, async scheduling)
RUNNERS = {"v1": ("0", False), "v1-async": ("0", True), "v2": ("1", False), "v2-async": ("1", True)}


@pytest.mark.parametrize("runner", list(RUNNERS))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_greedy_matches_transformers(tiny_model_dir, monkeypatch, kind, mode, runner):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the scheduler
    env_value, async_scheduling = RUNNERS[runner]
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env_value)
    model_dir = tiny_model_dir(kind)
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        seed=0,
        async_scheduling=async_scheduling,
        **MODES[mode],
    )
    config = llm.llm_engine.vllm_config
    assert config.use_v2_model_runner is (env_value == "1")
    assert config.max_concurrent_batches == (2 if async_scheduling else 1)
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    preempted = spy_preemptions(llm)
    in_flight = _spy_batches_in_flight(llm)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts()]
    outs = llm.generate(prompts, sp, use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == _expected(model_dir, kind)
    if mode == "preempt":
        assert preempted, "the small KV cache was meant to force preemption"
    # The batch queue exists only with async scheduling, and never overfills.
    # (tests/v1/engine/test_batch_queue.py shows two steps really in flight.)
    assert max(in_flight) <= (2 if async_scheduling else 0)


@pytest.mark.parametrize("kind", ["llama"])
def test_async_scheduling_default_under_v2(tiny_model_dir, monkeypatch, kind):
    """Dense models run on V2; async scheduling is on by default where it pays
    (multi-process executors, GPUs) and off for one CPU worker (see
    VllmConfig._async_scheduling_off_by_default_reason)."""
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    llm = LLM(model=tiny_model_dir(kind), dtype="float32", max_model_len=128)
    config = llm.llm_engine.vllm_config
    assert config.use_v2_model_runner  # a dense model
    assert not config.scheduler_config.async_scheduling
    assert config.max_concurrent_batches == 1
    mp = EngineArgs(
        model=tiny_model_dir(kind), dtype="float32", max_model_len=128, tensor_parallel_size=2
    ).create_engine_config()
    assert mp.parallel_config.distributed_executor_backend == "mp"
    assert mp.scheduler_config.async_scheduling and mp.max_concurrent_batches == 2
