"""Async scheduling keeps two steps in flight: the engine core schedules step
N+1 before it waits for step N, and the tokens are unchanged."""

from __future__ import annotations

import time

import pytest

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.executor.uniproc_executor import UniProcExecutor


class SlowUniProcExecutor(UniProcExecutor):
    """The real uniproc executor, with each forward pass made 30 ms longer so
    that a step is reliably still running when the next one is scheduled."""

    def _call(self, method, args, kwargs):
        if method != "execute_model":
            return super()._call(method, args, kwargs)
        time.sleep(0.03)
        return super()._call(method, args, kwargs)


def _generate(
    model_dir: str, async_scheduling: bool, runner: str, monkeypatch
) -> tuple[list, list[int]]:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        async_scheduling=async_scheduling,
        distributed_executor_backend=SlowUniProcExecutor,
    )
    core = llm.llm_engine.engine_core.engine_core
    executor = core.model_executor
    # At each launch: how many earlier steps are still running.
    running_at_launch: list[int] = []
    real = executor.execute_model

    def spy(scheduler_output, non_block=False):
        queue = core.batch_queue or ()
        running_at_launch.append(sum(not future.done() for future, *_ in queue))
        return real(scheduler_output, non_block=non_block)

    executor.execute_model = spy
    prompts = [TokensPrompt(prompt_token_ids=list(range(1, 10 + i))) for i in range(4)]
    outs = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False
    )
    return [o.outputs[0].token_ids for o in outs], running_at_launch


@pytest.mark.parametrize("runner", ["0", "1"], ids=["v1", "v2"])
@pytest.mark.parametrize("kind", ["qwen2"])
def test_two_steps_in_flight_same_tokens(tiny_model_dir, monkeypatch, kind, runner):
    model_dir = tiny_model_dir(kind)
    sync_tokens, sync_running = _generate(model_dir, False, runner, monkeypatch)
    async_tokens, async_running = _generate(model_dir, True, runner, monkeypatch)
    assert max(sync_running) == 0  # without async scheduling a step runs alone
    # Step N+1 was launched while step N still ran, never more than 2 at once.
    assert max(async_running) == 1
    assert async_tokens == sync_tokens


class FailingUniProcExecutor(UniProcExecutor):
    """The real uniproc executor whose forward pass raises."""

    def _call(self, method, args, kwargs):
        if method == "execute_model":
            raise RuntimeError("forward failed on purpose")
        return super()._call(method, args, kwargs)


@pytest.mark.parametrize("runner", ["0", "1"], ids=["v1", "v2"])
def test_forward_error_surfaces_through_the_batch_queue(tiny_model_dir, monkeypatch, runner):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    llm = LLM(
        model=tiny_model_dir("qwen2"),
        dtype="float32",
        max_model_len=128,
        async_scheduling=True,
        distributed_executor_backend=FailingUniProcExecutor,
    )
    with pytest.raises(RuntimeError, match="forward failed on purpose"):
        llm.generate(
            [TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4), use_tqdm=False
        )
