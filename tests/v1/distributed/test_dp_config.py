"""Data-parallel configuration: the flags -> ParallelConfig rules (upstream's),
the offline refusal, and the DP process group the MoE waves all-reduce over."""

from __future__ import annotations

import multiprocessing

import pytest

from vllm import LLM
from vllm.config import ParallelConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext


def _parallel(model: str, **kwargs) -> ParallelConfig:
    args = EngineArgs(model=model, device="cpu", **kwargs)
    return args.create_engine_config(UsageContext.OPENAI_API_SERVER).parallel_config


def test_dp_flags_resolve_as_upstream(tiny_model_dir):
    model = tiny_model_dir("llama")
    pc = _parallel(model, data_parallel_size=2)
    assert (pc.data_parallel_size, pc.data_parallel_size_local, pc.data_parallel_rank) == (2, 2, 0)
    assert pc.world_size_across_dp == 2 and not pc.local_engines_only
    assert pc.data_parallel_master_ip == "127.0.0.1" and pc.data_parallel_rpc_port == 29550
    # Head node with one local engine, the other joins over TCP.
    pc = _parallel(
        model, data_parallel_size=2, data_parallel_size_local=1, data_parallel_rpc_port=1234
    )
    assert (pc.data_parallel_size_local, pc.data_parallel_rpc_port) == (1, 1234)
    # A headless secondary node runs rank 1.
    args = EngineArgs(
        model=model,
        device="cpu",
        data_parallel_size=2,
        data_parallel_size_local=1,
        data_parallel_start_rank=1,
    )
    pc = args.create_engine_config(UsageContext.OPENAI_API_SERVER, headless=True).parallel_config
    assert (pc.data_parallel_rank, pc.data_parallel_index) == (1, 1)


def test_dp_group_ports_are_chosen_once():
    """Every engine gets the front end's config, so all ranks pop the same ports."""
    pc = ParallelConfig(data_parallel_size=2)
    ports = list(pc._data_parallel_master_port_list)
    assert len(set(ports)) == 4 and pc.data_parallel_master_port not in ports
    assert pc.get_next_dp_init_port() == ports[-1]
    assert ParallelConfig()._data_parallel_master_port_list == []


def test_mismatched_dp_sizes_are_refused(tiny_model_dir):
    with pytest.raises(ValueError, match=r"data_parallel_size_local \(3\) must be <= "):
        _parallel(tiny_model_dir("llama"), data_parallel_size=2, data_parallel_size_local=3)
    with pytest.raises(ValueError, match=r"data_parallel_rank \(2\) must be in the range"):
        ParallelConfig(data_parallel_size=2, data_parallel_rank=2)


def test_more_engines_than_cores_is_refused(tiny_model_dir, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ValueError, match=r"4 worker processes is larger than the 2 CPU cores"):
        _parallel(tiny_model_dir("llama"), data_parallel_size=4)


def test_offline_llm_refuses_data_parallel():
    with pytest.raises(ValueError, match=r"LLM\(data_parallel_size=2\) is not supported"):
        LLM(model="unused", data_parallel_size=2)


def _rank_main(rank: int, port_list: list[int], results) -> None:
    pc = ParallelConfig(
        data_parallel_size=2, data_parallel_rank=rank, _data_parallel_master_port_list=port_list
    )
    group = pc.stateless_init_dp_group(timeout_s=60)
    results[rank] = (
        ParallelConfig.has_unfinished_dp(group, rank == 1),
        ParallelConfig.has_unfinished_dp(group, False),
    )


def test_stateless_dp_group_all_reduces_unfinished():
    """Two DP ranks in separate processes: the OR of their 'unfinished' flags."""
    ports = list(ParallelConfig(data_parallel_size=2)._data_parallel_master_port_list)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=_rank_main, args=(r, list(ports), results)) for r in (0, 1)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(90)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        assert [proc.exitcode for proc in procs] == [0, 0]
        assert dict(results) == {0: (True, False), 1: (True, False)}


def test_zmq_addresses_loopback_and_the_dp_address_only():
    """All of 127/8 is loopback (one-machine Ray "nodes"); another host only
    once allowed as the DP address (-dpa); a wildcard never."""
    from vllm.v1.engine.ipc import allow_zmq_host, check_zmq_address

    check_zmq_address("tcp://127.0.0.2:5000")
    check_zmq_address("tcp://[::1]:5000")
    with pytest.raises(ValueError, match="Refusing ZMQ address"):
        check_zmq_address("tcp://192.0.2.77:5000")
    allow_zmq_host("192.0.2.77")
    check_zmq_address("tcp://192.0.2.77:5000")
    for wildcard in ("0.0.0.0", "::", "*"):
        with pytest.raises(ValueError, match="every interface"):
            allow_zmq_host(wildcard)
    with pytest.raises(ValueError, match="Refusing ZMQ address"):
        check_zmq_address("tcp://0.0.0.0:5000")
