"""Tensor and pipeline parallelism on the multiprocess executor, on CPU with
gloo: greedy tokens equal the single-worker engine's under both model runners,
and the engine keeps `max_concurrent_batches` steps in flight (with async
scheduling: pp + 1 under Model Runner V2; V1 runs PP without async
scheduling, so pp).

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so
the tests can look at its executor; the workers are child processes (forked).
"""

from __future__ import annotations

import gc

import pytest

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], list(range(10, 47))]
MAX_TOKENS = 8
_reference: dict[str, list[list[int]]] = {}


def run_engine(
    model: str, tp: int, pp: int, backend: str | None
) -> tuple[list[list[int]], dict[str, object]]:
    """Greedy tokens for PROMPTS, and what the engine says about its executor."""
    # 16-token steps: the 37-token prompt is prefilled in chunks, while the
    # other requests already decode.
    llm = LLM(
        model=model,
        dtype="float32",
        max_model_len=128,
        max_num_seqs=4,
        seed=0,
        max_num_batched_tokens=16,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        distributed_executor_backend=backend,
    )
    try:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in PROMPTS],
            SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
            use_tqdm=False,
        )
        core = llm.llm_engine.engine_core.engine_core
        executor = core.model_executor
        info = dict(
            executor=type(executor).__name__,
            executor_obj=executor,
            executor_batches=executor.max_concurrent_batches,
            core_batches=core.batch_queue_size,
            config_batches=llm.llm_engine.vllm_config.max_concurrent_batches,
            async_scheduling=llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
        )
        return [list(o.outputs[0].token_ids) for o in outs], info
    finally:
        llm.llm_engine.shutdown()
        del llm
        gc.collect()


@pytest.fixture(params=["0", "1"], ids=["V1", "V2"])
def runner(request, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", request.param)
    return "V2" if request.param == "1" else "V1"


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)], ids=["tp2", "pp2", "tp2xpp2"])
def test_greedy_parity_with_one_worker(tiny_model_dir, runner, tp, pp):
    model = tiny_model_dir("qwen2")  # q/k/v biases: their shards are checked too
    if runner not in _reference:
        _reference[runner], info = run_engine(model, 1, 1, None)
        assert info["executor"] == "UniProcExecutor"
    # TP=2 leaves the backend unset: more than one worker on one node picks mp.
    tokens, info = run_engine(model, tp, pp, None if (tp, pp) == (2, 1) else "mp")
    assert tokens == _reference[runner]
    assert info["executor"] == "MultiprocExecutor"
    # Async scheduling is on by default on mp: V2 keeps one more step in
    # flight than there are pipeline stages; V1 runs ahead only without
    # pipeline parallelism (2 batches), as upstream.
    v1_async = runner == "V1" and pp == 1
    expected = pp + 1 if runner == "V2" else (2 if v1_async else pp)
    assert info["async_scheduling"] == (runner == "V2" or v1_async)
    assert info["executor_batches"] == info["core_batches"] == info["config_batches"] == expected


def test_backend_choice():
    from vllm.config import ParallelConfig

    assert ParallelConfig().distributed_executor_backend == "uni"
    assert ParallelConfig(tensor_parallel_size=2).distributed_executor_backend == "mp"
    assert (
        ParallelConfig(
            pipeline_parallel_size=2, distributed_executor_backend="ray"
        ).distributed_executor_backend
        == "ray"
    )
    with pytest.raises(ValueError):
        ParallelConfig(distributed_executor_backend="threads")
