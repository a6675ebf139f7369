"""Model Runner V2 end to end through `LLM` (in-process engine): the worker
builds the V2 runner, and a seeded request (temperature 0.8, seed 42) gets
the same tokens alone and inside a batch of 16 mixed requests, with async
scheduling on and off and chunked prefill forced."""

import random

import pytest

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def llm(request, tiny_model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
        llm = LLM(
            model=tiny_model_dir("llama"),
            dtype="float32",
            max_model_len=128,
            max_num_batched_tokens=32,
            max_num_seqs=16,
            seed=0,
            async_scheduling=request.param,
        )
        assert llm.llm_engine.vllm_config.use_v2_model_runner
    return llm


def test_the_worker_runs_model_runner_v2(llm):
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    runners = llm.llm_engine.engine_core.engine_core.model_executor.collective_rpc(
        lambda worker: type(worker.model_runner)
    )
    assert runners == [GPUModelRunner]


def test_seeded_request_alone_and_in_a_batch_of_16(llm):
    target = TokensPrompt(prompt_token_ids=_prompt(0, 20))
    seeded = SamplingParams(temperature=0.8, seed=42, max_tokens=12, ignore_eos=True)
    (alone,) = llm.generate(target, seeded, use_tqdm=False)
    others = [TokensPrompt(prompt_token_ids=_prompt(i, 5 + 3 * i)) for i in range(1, 16)]
    kinds = [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=7, top_k=20, max_tokens=6, ignore_eos=True),
        SamplingParams(
            temperature=1.3, top_p=0.9, max_tokens=14, ignore_eos=True, presence_penalty=0.5
        ),
    ]
    params = [kinds[i % len(kinds)] for i in range(15)]
    # The target sits in the middle of the batch, its prefill chunked differently.
    batch = others[:7] + [target] + others[7:]
    outs = llm.generate(batch, params[:7] + [seeded] + params[7:], use_tqdm=False)
    assert outs[7].outputs[0].token_ids == alone.outputs[0].token_ids
    greedy = llm.generate(
        target, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )[0]
    assert alone.outputs[0].token_ids != greedy.outputs[0].token_ids
