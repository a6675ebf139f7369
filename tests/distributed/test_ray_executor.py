"""The Ray executor (--distributed-executor-backend ray) on CPU with gloo:
TP=2 equals one worker token for token under both runners, with a local Ray
the executor starts itself and with an existing cluster reached by address;
async scheduling is on by default for the Ray executor under both runners
(pp = 1), so two steps are in flight."""

from __future__ import annotations

import os

import pytest
import ray

from tests.distributed.test_multiproc_executor import run_engine
from tests.v1.distributed.ray_cluster import RayCluster


@pytest.fixture
def in_process_engine(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # Ray >= 2.50 may turn on token auth for clusters started with `ray start`;
    # this test cluster is local and throw-away.
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()


def _check_tp2(model: str, monkeypatch, runner: str) -> dict[str, object]:
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "V2" else "0")
    reference, _ = run_engine(model, 1, 1, None)
    tokens, info = run_engine(model, 2, 1, "ray")
    assert info["executor"] == "RayDistributedExecutor"
    assert tokens == reference
    # pp = 1 and async by default (as upstream, V1 too): 2 steps in flight.
    assert info["executor_batches"] == info["core_batches"] == 2
    return info


def test_tp2_on_a_local_ray_started_by_the_executor(tiny_model_dir, in_process_engine, monkeypatch):
    info = _check_tp2(tiny_model_dir("qwen2"), monkeypatch, "V1")
    assert info["executor_obj"]._started_ray
    assert not ray.is_initialized()  # the executor shut down the Ray it started


def test_tp2_on_an_existing_ray_cluster(tiny_model_dir, in_process_engine, monkeypatch):
    # Its own cluster, stopped by process group: `ray stop` would stop every
    # Ray on the machine (other tests' clusters too).
    with RayCluster(head_cpus=2) as cluster:
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        try:
            info = _check_tp2(tiny_model_dir("qwen2"), monkeypatch, "V2")
            assert not info["executor_obj"]._started_ray
        finally:
            if ray.is_initialized():
                ray.shutdown()


def test_dead_ray_worker_fails_the_executor(tiny_model_dir, in_process_engine):
    import signal

    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor.ray_executor import RayDistributedExecutor

    config = EngineArgs(
        model=tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=64,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
    ).create_engine_config()
    executor = RayDistributedExecutor(config)
    failures = []
    executor.register_failure_callback(lambda: failures.append(True))
    try:
        pids = executor.collective_rpc("get_pid")
        assert len(set(pids)) == 2
        with pytest.raises(TypeError):  # methods travel by name only
            executor.collective_rpc(lambda worker: worker.rank)
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(RuntimeError, match="Ray worker died"):
            executor.collective_rpc("check_health", timeout=30)
        assert executor.is_failed and failures == [True]
        with pytest.raises(RuntimeError):
            executor.collective_rpc("check_health")
    finally:
        executor.shutdown()
    assert not ray.is_initialized()
