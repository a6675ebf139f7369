"""Async scheduling with the V1 model runner (vllm/v1/worker/async_sampled_tokens.py):
the runner fills the in-flight decode tokens on the device, and every output
(greedy stops mid-flight, seeded sampling with penalties and bad words,
logprobs, chunked prefill) equals the synchronous run's. Greedy parity with
transformers under V1 + async is in tests/models/test_greedy_parity.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from vllm import LLM, SamplingParams
from vllm.config import SchedulerConfig, VllmConfig
from vllm.config.parallel import ParallelConfig
from vllm.inputs import TokensPrompt
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.async_sampled_tokens import AsyncSampledTokens
from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


def _llm(model_dir: str, async_scheduling: bool, monkeypatch, **kwargs) -> LLM:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        seed=0,
        async_scheduling=async_scheduling,
        **kwargs,
    )
    config = llm.llm_engine.vllm_config
    assert not config.use_v2_model_runner
    assert config.scheduler_config.async_scheduling is async_scheduling
    assert config.max_concurrent_batches == (2 if async_scheduling else 1)
    return llm


def _count_filled_tokens(monkeypatch) -> list[int]:
    """Record how many in-flight tokens each step fills on the device."""
    counts: list[int] = []
    real = AsyncSampledTokens.scatter_into_input_ids

    def spy(self, req_ids, input_ids_np, input_ids_gpu, cu_num_tokens):
        total = int(cu_num_tokens[-1])
        counts.append(int((input_ids_np[:total] == -1).sum()))
        real(self, req_ids, input_ids_np, input_ids_gpu, cu_num_tokens)
        assert not (input_ids_gpu[:total] < 0).any()  # host device: same buffer

    monkeypatch.setattr(AsyncSampledTokens, "scatter_into_input_ids", spy)
    return counts


def _run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]):
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.outputs[0].finish_reason) for o in outs]


def test_requests_ending_mid_flight(tiny_model_dir, monkeypatch):
    """Requests that stop (stop token, max_tokens) at step N while step N+1 is
    already scheduled end exactly where the synchronous run ends them: the
    token sampled for them in step N+1 is thrown away."""
    model_dir = tiny_model_dir("llama")
    prompts = [_prompt(i, 6 + 5 * i) for i in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    sync_llm = _llm(model_dir, False, monkeypatch)
    reference = _run(sync_llm, prompts, [greedy] * len(prompts))
    # Stop requests 0-2 on their 3rd, 6th, 9th token; cap 3-4 at 1 and 7 tokens.
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=[reference[i][0][3 * i + 2]])
        for i in range(3)
    ]
    params += [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 7)]
    params.append(greedy)
    expected = _run(sync_llm, prompts, params)
    del sync_llm
    for i in range(3):
        tokens, reason = expected[i]
        assert reason == "stop" and tokens[-1] == params[i].stop_token_ids[0]
        assert len(tokens) <= 3 * i + 3
    assert [len(t) for t, _ in expected[3:]] == [1, 7, 20]

    filled = _count_filled_tokens(monkeypatch)
    async_llm = _llm(model_dir, True, monkeypatch)
    assert _run(async_llm, prompts, params) == expected
    assert max(filled) > 1  # decode tokens really came from the step in flight


def test_seeded_sampling_penalties_logprobs_same_as_sync(tiny_model_dir, monkeypatch):
    """Seeded random sampling with penalties and bad words (which read the
    output tokens, placeholders resolved) and logprobs, under chunked
    prefill: the same tokens and logprobs with and without async scheduling."""
    model_dir = tiny_model_dir("qwen2")
    prompts = [_prompt(10 + i, 4 + 7 * i) for i in range(8)]
    kinds = [
        SamplingParams(temperature=0.9, seed=1, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(
            temperature=1.2,
            seed=2,
            top_k=20,
            max_tokens=9,
            ignore_eos=True,
            presence_penalty=0.8,
            frequency_penalty=0.5,
        ),
        SamplingParams(
            temperature=0.7,
            seed=3,
            top_p=0.9,
            max_tokens=14,
            ignore_eos=True,
            repetition_penalty=1.3,
        ),
        SamplingParams(
            temperature=0.0, max_tokens=10, ignore_eos=True, repetition_penalty=2.0, logprobs=1
        ),
    ]
    params = [kinds[i % len(kinds)] for i in range(len(prompts))]
    results = []
    for async_scheduling in (False, True):
        llm = _llm(
            model_dir, async_scheduling, monkeypatch, max_num_batched_tokens=16, max_num_seqs=8
        )
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        results.append(
            [
                (list(o.outputs[0].token_ids), [sorted(d) for d in o.outputs[0].logprobs or []])
                for o in outs
            ]
        )
        del llm
    assert results[0] == results[1]
    # The penalties changed something (else they were not exercised).
    assert results[0][3][0] != results[0][3][0][:1] * len(results[0][3][0])


def test_bad_words_read_resolved_tokens(tiny_model_dir, monkeypatch):
    """Bad words check the tokens generated so far: with a placeholder in
    their place the prefix would never match. Same output sync and async."""
    model_dir = tiny_model_dir("llama")
    prompts = [_prompt(30 + i, 9 + 4 * i) for i in range(4)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * 4
    sync_llm = _llm(model_dir, False, monkeypatch)
    free = _run(sync_llm, prompts, greedy)
    # Ban the pair (token 3, token 4) of each free output, as token ids (set
    # directly: the tiny tokenizer's words are not what we want to ban).
    params = []
    for toks, _ in free:
        p = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        p._bad_words_token_ids = [toks[3:5]]
        params.append(p)
    expected = _run(sync_llm, prompts, params)
    del sync_llm
    assert all(e[0][:4] == f[0][:4] and e[0][4] != f[0][4] for e, f in zip(expected, free))
    async_llm = _llm(model_dir, True, monkeypatch)
    assert _run(async_llm, prompts, params) == expected


def test_reset_prefix_cache_with_tokens_in_flight(tiny_model_dir, monkeypatch):
    """Resetting the prefix cache preempts the running requests while their
    tokens are in flight: they restart from their known tokens (re-sent
    whole, no placeholder to fill), the stale tokens are dropped, and the
    outputs are the synchronous run's."""
    model_dir = tiny_model_dir("llama")
    prompts = [_prompt(50 + i, 8 + 6 * i) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    sync_llm = _llm(model_dir, False, monkeypatch, enable_prefix_caching=True)
    expected = [t for t, _ in _run(sync_llm, prompts, [params] * len(prompts))]
    del sync_llm

    llm = _llm(model_dir, True, monkeypatch, enable_prefix_caching=True)
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), TokensPrompt(prompt_token_ids=prompt), params)
    got: dict[str, list[int]] = {}
    num_resets = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                got[out.request_id] = list(out.outputs[0].token_ids)
        in_flight = any(r.num_output_placeholders for r in scheduler.running)
        if in_flight and num_resets < 2 and len(got) < len(prompts) - 1:
            assert engine.reset_prefix_cache(reset_running_requests=True)
            num_resets += 1
    assert num_resets == 2
    assert [got[str(i)] for i in range(len(prompts))] == expected


def test_async_output_reports_no_token_for_mid_prefill_rows():
    sampled = torch.tensor([[5], [7], [9]], dtype=torch.int32)
    out = ModelRunnerOutput(req_ids=["a", "b", "c"], req_id_to_index={"a": 0, "b": 1, "c": 2})
    async_out = AsyncGPUModelRunnerOutput(out, sampled, None, [1], None)
    assert async_out.get_output().sampled_token_ids == [[5], [], [9]]


def _in_flight(prev, prev_sampled) -> AsyncSampledTokens:
    tokens = AsyncSampledTokens(None)
    tokens.req_id_to_index = prev
    tokens.sampled_token_ids = prev_sampled
    return tokens


def test_scatter_fills_each_requests_last_token():
    # Now: "b" (1 decode token), "n" (new, 3 prompt tokens), "a" (1 decode token);
    # in the previous step "a" was row 0 and "b" row 2 ("x" finished since).
    tokens = _in_flight(
        {"a": 0, "x": 1, "b": 2}, torch.tensor([[11], [12], [13]], dtype=torch.int32)
    )
    host = np.array([-1, 4, 5, 6, -1], dtype=np.int32)
    device = torch.from_numpy(host.copy())
    tokens.scatter_into_input_ids(["b", "n", "a"], host, device, np.array([1, 4, 5]))
    assert device.tolist() == [13, 4, 5, 6, 11]


def test_scatter_rejects_placeholders_it_cannot_fill():
    tokens = _in_flight({}, None)
    host = np.array([3, -1], dtype=np.int32)
    with pytest.raises(AssertionError):
        tokens.scatter_into_input_ids(["a"], host, torch.from_numpy(host.copy()), np.array([2]))


def _config(pp: int, use_v2: bool, monkeypatch) -> VllmConfig:
    from types import SimpleNamespace

    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: use_v2))
    model = SimpleNamespace(
        model="m",
        architectures=["LlamaForCausalLM"],
        runner_type="generate",
        is_moe=False,
        max_model_len=128,
        enforce_eager=True,
    )
    return VllmConfig(
        model_config=model,
        scheduler_config=SchedulerConfig(async_scheduling=True),
        parallel_config=ParallelConfig(
            pipeline_parallel_size=pp, distributed_executor_backend="mp"
        ),
    )


def test_config_allows_v1_async_but_not_with_pipeline_parallelism(monkeypatch):
    assert _config(1, False, monkeypatch).max_concurrent_batches == 2
    assert _config(2, True, monkeypatch).max_concurrent_batches == 3
    with pytest.raises(ValueError, match="pipeline parallelism"):
        _config(2, False, monkeypatch)


def test_v1_async_default_follows_the_executor(tiny_model_dir, monkeypatch):
    """Off by default for one CPU worker (measured slower there, see
    VllmConfig._async_scheduling_off_by_default_reason), on for mp, as V2."""
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    model = tiny_model_dir("llama")
    uni = EngineArgs(model=model, dtype="float32", max_model_len=128).create_engine_config()
    assert not uni.use_v2_model_runner
    assert not uni.scheduler_config.async_scheduling and uni.max_concurrent_batches == 1
    mp = EngineArgs(
        model=model, dtype="float32", max_model_len=128, tensor_parallel_size=2
    ).create_engine_config()
    assert mp.scheduler_config.async_scheduling and mp.max_concurrent_batches == 2
    pp = EngineArgs(
        model=model, dtype="float32", max_model_len=128, pipeline_parallel_size=2
    ).create_engine_config()
    assert not pp.scheduler_config.async_scheduling and pp.max_concurrent_batches == 2
