"""`--data-parallel-backend ray` on a two-node Ray cluster (one machine, see
ray_cluster.py; shared by the package, conftest.py): CoreEngineActorManager
places DP rank 0 on the DP master (head) node and rank 1 on the other node,
one placement group each; both engine-core actors answer the front end's ZMQ
sockets with the greedy tokens of a single engine (TP=1). The Ray executor
spreads TP=2 workers over the two nodes. -dp larger than the cluster and a Ray
address that does not answer fail at once with errors naming them.

The front end here is a bare ROUTER / PULL pair (the engine-core wire
protocol), so these tests need neither the DP client nor the server. The
`vllm serve` tests (test_ray_dp_serve.py) prove -dp 2 -tp 2 across the nodes
and the loss of a node under load; test_ray_dp_moe.py an MoE model's ranks.
"""

from __future__ import annotations

import time

import pytest
import zmq

from tests.v1.distributed.ray_cluster import HEAD_IP
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequest, EngineCoreRequestType
from vllm.v1.engine.ipc import EngineZmqAddresses
from vllm.v1.executor.abstract import Executor
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

ray = pytest.importorskip("ray")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13]]
MAX_TOKENS = 8


@pytest.fixture
def ray_env(two_node_ray_cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", two_node_ray_cluster.address)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    yield two_node_ray_cluster
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Greedy tokens of one in-process engine."""
    from vllm import LLM

    llm = LLM(model=tiny_model_dir("qwen2"), dtype="float32", max_model_len=64, enforce_eager=True)
    try:
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in PROMPTS],
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
        )
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.llm_engine.shutdown()


class BareFrontEnd:
    """The front end's two sockets on loopback tcp (engines on another Ray
    node connect to them), and the engine-core wire protocol."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.inputs = self.ctx.socket(zmq.ROUTER)
        self.inputs.bind("tcp://127.0.0.1:0")
        self.outputs = self.ctx.socket(zmq.PULL)
        self.outputs.bind("tcp://127.0.0.1:0")
        self.addresses = EngineZmqAddresses(
            inputs=[self.inputs.getsockopt(zmq.LAST_ENDPOINT).decode()],
            outputs=[self.outputs.getsockopt(zmq.LAST_ENDPOINT).decode()],
        )
        self.encoder, self.decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)

    def wait_for_engines(self, count: int) -> set[bytes]:
        identities: set[bytes] = set()
        while len(identities) < count:
            assert self.inputs.poll(60_000), "an engine did not connect its input socket"
            identity, _ = self.inputs.recv_multipart()
            identities.add(identity)
        return identities

    def add(self, engine: bytes, request_id: str, prompt: list[int]) -> None:
        request = EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt,
            mm_features=None,
            sampling_params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
            pooling_params=None,
            eos_token_id=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        self.inputs.send_multipart(
            (engine, EngineCoreRequestType.ADD.value, *self.encoder.encode(request))
        )

    def collect(self, count: int, timeout_s: float = 120) -> dict[str, tuple[int, list[int]]]:
        """request id -> (engine index, tokens), for `count` finished requests."""
        tokens: dict[str, list[int]] = {}
        engine: dict[str, int] = {}
        finished: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while len(finished) < count:
            assert time.monotonic() < deadline, f"only {finished} finished"
            if not self.outputs.poll(1000):
                continue
            outputs = self.decoder.decode(self.outputs.recv_multipart())
            for out in outputs.outputs:
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
                engine[out.request_id] = outputs.engine_index
                if out.finish_reason is not None:
                    finished.add(out.request_id)
        return {rid: (engine[rid], tokens[rid]) for rid in finished}

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def _dp2_config(model: str, tp: int):
    return EngineArgs(
        model=model,
        dtype="float32",
        max_model_len=64,
        enforce_eager=True,
        data_parallel_size=2,
        data_parallel_size_local=1,
        data_parallel_backend="ray",
        data_parallel_address=HEAD_IP,
        tensor_parallel_size=tp,
    ).create_engine_config()


def _pg_node_ips(manager) -> list[set[str]]:
    """The node IPs of each DP rank's placement group bundles."""
    from ray.util.placement_group import placement_group_table

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    return [
        {ips[node] for node in placement_group_table(pg)["bundles_to_node_id"].values()}
        for pg in manager.created_placement_groups
    ]


def test_dp2_on_two_ray_nodes_equals_one_engine(ray_env, tiny_model_dir, reference):
    from vllm.v1.engine.ray_dp import CoreEngineActorManager

    config = _dp2_config(tiny_model_dir("qwen2"), 1)
    front = BareFrontEnd()
    manager = CoreEngineActorManager(config, front.addresses, Executor.get_class(config), False)
    try:
        assert config.cache_config.num_gpu_blocks  # the actors' KV size reached the front end
        # Rank 0 on the DP master (head) node, rank 1 on the other node.
        assert _pg_node_ips(manager) == [{HEAD_IP}, {ray_env.nodes[1].ip}]
        engines = sorted(front.wait_for_engines(2))
        assert engines == [(0).to_bytes(2, "little"), (1).to_bytes(2, "little")]
        for engine in engines:  # every prompt on both engines
            for i, prompt in enumerate(PROMPTS):
                front.add(engine, f"{engine[0]}-{i}", prompt)
        results = front.collect(2 * len(PROMPTS))
        for rank in (0, 1):
            for i in range(len(PROMPTS)):
                assert results[f"{rank}-{i}"] == (rank, reference[i])
    finally:
        manager.close()
        front.close()
    assert manager.closed


def test_tp2_workers_span_two_ray_nodes(ray_env, tiny_model_dir, reference, monkeypatch):
    """The Ray executor places TP ranks by its placement group's bundles, in
    node order, this node first: with two of the head's three CPUs held, the
    group gets one bundle per node, rank 0 here; gloo's rendezvous is on rank
    0's node address and the tokens equal one engine's."""
    from vllm import LLM

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ray.init(address=ray_env.address, log_to_driver=False)
    hold = ray.util.placement_group([{"CPU": 2, f"node:{HEAD_IP}": 0.001}])
    ray.get(hold.ready(), timeout=60)
    llm = None
    try:
        llm = LLM(
            model=tiny_model_dir("qwen2"),
            dtype="float32",
            max_model_len=64,
            enforce_eager=True,
            tensor_parallel_size=2,
            distributed_executor_backend="ray",
        )
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        assert executor.collective_rpc("get_node_ip") == [HEAD_IP, ray_env.nodes[1].ip]
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in PROMPTS],
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
        )
        assert [list(o.outputs[0].token_ids) for o in outs] == reference
    finally:
        if llm is not None:
            llm.llm_engine.shutdown()
        ray.util.remove_placement_group(hold)


def test_dp_larger_than_the_cluster_is_refused(ray_env, tiny_model_dir):
    from vllm.v1.engine.ray_dp import CoreEngineActorManager

    config = EngineArgs(
        model=tiny_model_dir("qwen2"),
        dtype="float32",
        max_model_len=64,
        data_parallel_size=3,
        data_parallel_size_local=1,
        data_parallel_backend="ray",
        data_parallel_address=HEAD_IP,
    ).create_engine_config()
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"data_parallel_size=3 \(-dp/--data-parallel-size\)"):
        CoreEngineActorManager(config, BareFrontEnd().addresses, Executor.get_class(config), False)
    assert time.monotonic() - start < 60
    # Nothing is left reserved: the placement groups made before the error are gone.
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())


def test_ray_address_that_does_not_answer(monkeypatch):
    from vllm.v1.executor.ray_utils import connect_ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="Cannot reach the Ray cluster at '127.0.0.1:9'"):
        connect_ray("127.0.0.1:9")
    assert time.monotonic() - start < 15
    assert not ray.is_initialized()
