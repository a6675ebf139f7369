"""Executor.get_class and the in-process executor driving a real worker."""

from concurrent.futures import Future

import pytest

from tests.v1.worker.utils import make_kv_cache_config, make_vllm_config
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.executor.uniproc_executor import UniProcExecutor


@pytest.fixture(scope="module")
def executor(tiny_model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        executor = UniProcExecutor(make_vllm_config(tiny_model_dir("llama")))
    yield executor
    executor.shutdown()


def _prefill(req_id: str, prompt: list[int]) -> SchedulerOutput:
    new = NewRequestData(
        req_id=req_id,
        prompt_token_ids=prompt,
        mm_features=[],
        sampling_params=SamplingParams(temperature=0.0),
        pooling_params=None,
        block_ids=([1, 2],),
        num_computed_tokens=0,
        lora_request=None,
    )
    return SchedulerOutput(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={req_id: len(prompt)},
        total_num_scheduled_tokens=len(prompt),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[0],
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )


def test_get_class(tiny_model_dir):
    config = make_vllm_config(tiny_model_dir("llama"))
    assert config.parallel_config.distributed_executor_backend == "uni"
    assert Executor.get_class(config) is UniProcExecutor
    config.parallel_config.distributed_executor_backend = UniProcExecutor
    assert Executor.get_class(config) is UniProcExecutor
    config.parallel_config.distributed_executor_backend = (
        "vllm.v1.executor.uniproc_executor.UniProcExecutor"
    )
    assert Executor.get_class(config) is UniProcExecutor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.executor.ray_executor import RayDistributedExecutor

    for backend, cls in (("mp", MultiprocExecutor), ("ray", RayDistributedExecutor)):
        config.parallel_config.distributed_executor_backend = backend
        assert Executor.get_class(config) is cls
    config.parallel_config.distributed_executor_backend = "external_launcher"
    with pytest.raises(ValueError, match="not built yet"):
        Executor.get_class(config)
    config.parallel_config.distributed_executor_backend = dict
    with pytest.raises(TypeError):
        Executor.get_class(config)


def test_kv_cache_setup_and_one_step(executor):
    (specs,) = executor.get_kv_cache_specs()
    assert executor.determine_available_memory() == [1 << 22]
    executor.initialize_from_config([make_kv_cache_config(specs)])
    assert executor.max_concurrent_batches == 1
    assert UniProcExecutor.supports_async_scheduling()  # via its worker thread
    assert executor.supported_tasks == ("generate",)
    executor.check_health()

    future = executor.execute_model(_prefill("r0", [5, 6, 7, 8, 9]), non_block=True)
    assert isinstance(future, Future) and future.done()
    assert future.result() is None  # logits wait for sample_tokens
    output = executor.sample_tokens(None)
    assert output.req_ids == ["r0"]
    assert len(output.sampled_token_ids[0]) == 1


def test_collective_rpc(executor):
    assert executor.collective_rpc(lambda worker, x: x + worker.rank, args=(41,)) == [41]
    assert executor.collective_rpc("get_supported_tasks", non_block=True).result() == [
        ("generate",)
    ]
    with pytest.raises(NotImplementedError):
        executor.collective_rpc("no_such_method")
    # A failing non-blocking call hands back the exception in the Future.
    future = executor.collective_rpc(lambda worker: 1 / 0, non_block=True)
    with pytest.raises(ZeroDivisionError):
        future.result()


def test_async_runner_outputs_are_resolved(executor):
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

    class Pending(AsyncModelRunnerOutput):
        def get_output(self) -> ModelRunnerOutput:
            return ModelRunnerOutput(
                req_ids=["x"], req_id_to_index={"x": 0}, sampled_token_ids=[[7]]
            )

    out = executor.collective_rpc(lambda worker: Pending(), non_block=True).result()
    assert out[0].sampled_token_ids == [[7]]
    assert executor.collective_rpc(lambda worker: Pending())[0].req_ids == ["x"]
