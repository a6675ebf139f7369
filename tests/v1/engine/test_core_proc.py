"""The engine core in its own process, driven through SyncMPClient: requests,
aborts, utility calls, malformed input, start-up failure and core death."""

from __future__ import annotations

import os
import pickle
import signal

import pytest

from tests.v1.engine.conftest import make_request
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequestType, FinishReason
from vllm.v1.engine.core_client import EngineCoreClient
from vllm.v1.engine.core_client_mp import SyncMPClient
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.executor.abstract import Executor

MAX_MODEL_LEN = 64


def _make_client(model_dir: str, **overrides) -> SyncMPClient:
    kwargs = dict(
        model=model_dir,
        dtype="float32",
        max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=8 * 2**20,
    )
    kwargs.update(overrides)
    config = EngineArgs(**kwargs).create_engine_config()
    client = EngineCoreClient.make_client(
        multiprocess_mode=True,
        asyncio_mode=False,
        vllm_config=config,
        executor_class=Executor.get_class(config),
        log_stats=True,
    )
    assert isinstance(client, SyncMPClient)
    return client


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    c = _make_client(tiny_model_dir("llama"))
    yield c
    c.shutdown()


def _next_output(client: SyncMPClient, timeout: float = 30.0) -> EngineCoreOutputs:
    """get_output() with a deadline, so a broken engine fails the test, not hangs it."""
    out = client.outputs_queue.get(timeout=timeout)
    if isinstance(out, Exception):
        raise out
    return out


def _run_to_completion(client: SyncMPClient, request_ids: set[str]) -> dict[str, list]:
    """Collect outputs until every request in `request_ids` finished."""
    tokens: dict[str, list[int]] = {rid: [] for rid in request_ids}
    reasons: dict[str, FinishReason] = {}
    while len(reasons) < len(request_ids):
        for out in _next_output(client).outputs:
            if out.request_id not in request_ids:
                continue
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
    return {rid: [tokens[rid], reasons[rid]] for rid in request_ids}


def _drain_until_idle(client: SyncMPClient) -> None:
    """Read outputs until the scheduler reports nothing running or waiting."""
    while True:
        stats = _next_output(client, timeout=10).scheduler_stats
        if stats is not None and stats.num_running_reqs == stats.num_waiting_reqs == 0:
            assert stats.kv_cache_usage == 0.0
            return


def test_ready_reports_kv_blocks(client):
    config = client.vllm_config
    assert config.cache_config.num_gpu_blocks > 0
    assert config.model_config.max_model_len == MAX_MODEL_LEN


def test_requests_and_abort(client):
    for i in range(3):
        client.add_request(
            make_request(
                [1 + i, 2, 3, 4],
                request_id=f"req-{i}",
                temperature=0.0,
                max_tokens=5 + i,
                ignore_eos=True,
            )
        )
    client.add_request(
        make_request([9, 8, 7], request_id="long", temperature=0.0, max_tokens=50, ignore_eos=True)
    )
    got_long: list[int] = []
    done: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {f"req-{i}": [] for i in range(3)}
    while len(done) < 3:
        for out in _next_output(client).outputs:
            if out.request_id == "long":
                got_long.extend(out.new_token_ids)
                if len(got_long) == 2:
                    client.abort_requests(["long"])
                assert not out.finished, "aborted requests get no output from the core"
                continue
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                assert out.finish_reason == FinishReason.LENGTH
                done[out.request_id] = tokens[out.request_id]
    assert [len(done[f"req-{i}"]) for i in range(3)] == [5, 6, 7]
    # Aborted early: its blocks are freed, nothing is left running.
    _drain_until_idle(client)
    assert 2 <= len(got_long) < 50


def test_utility_calls(client):
    assert client.reset_prefix_cache() is True
    with pytest.raises(Exception, match="Call to no_such_method method failed"):
        client.call_utility("no_such_method")
    # Private and loop-control methods are not callable remotely.
    with pytest.raises(Exception, match="not a utility method"):
        client.call_utility("run_busy_loop")
    with pytest.raises(TypeError, match="method name"):
        client.collective_rpc(lambda worker: 1)
    # A result msgpack cannot carry (a torch module) fails this call only.
    with pytest.raises(Exception, match="could not be sent"):
        client.collective_rpc("get_model")
    assert client.collective_rpc("determine_available_memory")[0] > 0


def test_malformed_input_is_dropped(client):
    """A pickle (or any garbage) on the input socket is refused, never loaded;
    a request the core cannot accept is answered with an error; the core lives on."""
    evil = pickle.dumps(SamplingParams())
    client.input_socket.send_multipart([client.core_engine, EngineCoreRequestType.ADD.value, evil])
    client.input_socket.send_multipart(
        [client.core_engine, EngineCoreRequestType.UTILITY.value, b"\xc1"]
    )
    client.input_socket.send_multipart([client.core_engine, b"\x09", b""])
    # Duplicate id: the second copy is answered with an error (request-scoped).
    client.add_request(make_request([1, 2], request_id="dup", max_tokens=6, ignore_eos=True))
    client.add_request(make_request([1, 2], request_id="dup", max_tokens=6, ignore_eos=True))
    reasons = []
    while len(reasons) < 2:
        reasons += [o.finish_reason for o in _next_output(client).outputs if o.finished]
    assert sorted(reasons) == [FinishReason.LENGTH, FinishReason.ERROR]
    client.add_request(make_request([3, 4], request_id="after", max_tokens=4, ignore_eos=True))
    assert len(_run_to_completion(client, {"after"})["after"][0]) == 4


def test_startup_failure_is_reported(tiny_model_dir):
    """The KV cache cannot hold one max-length request: the core fails during
    init, the client raises with the cause, and no process is left behind."""
    before = _engine_children()
    with pytest.raises(RuntimeError, match="Engine core initialization failed") as exc:
        _make_client(tiny_model_dir("llama"), kv_cache_memory_bytes=4096, max_model_len=256)
    assert "KV cache" in str(exc.value) or "max seq len" in str(exc.value)
    assert _engine_children() == before


def test_core_death_raises_engine_dead(tiny_model_dir):
    before = _engine_children()
    client = _make_client(tiny_model_dir("llama"))
    try:
        proc = client.resources.engine_manager.processes[0]
        client.add_request(make_request([1, 2, 3], request_id="x", max_tokens=40, ignore_eos=True))
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):
            while True:
                _next_output(client)
        with pytest.raises(EngineDeadError):
            client.add_request(make_request([1], request_id="y"))
        with pytest.raises(EngineDeadError):
            client.get_output()
    finally:
        client.shutdown()
    assert _engine_children() == before


def _engine_children() -> set[int]:
    """Live (non-zombie) engine-core processes started by this test process."""
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children() if p.name.startswith("EngineCore")}
