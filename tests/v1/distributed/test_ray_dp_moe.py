"""`vllm serve -dp 2 -dpl 1 --data-parallel-backend ray` with an MoE model
(tiny Mixtral) on a two-node Ray cluster (one machine, see ray_cluster.py;
shared by the package's Ray tests, conftest.py):
the engine-core actors are DPMoEEngineCoreActor, stepping in lock-step waves
over the DP group across the two nodes; greedy outputs equal transformers'
and both engines answer."""

from __future__ import annotations

import asyncio

from tests.models.zoo_utils import build_zoo_model
from tests.utils import hf_greedy
from tests.v1.distributed.test_dp_moe import MAX_TOKENS, PROMPTS, _complete_all, _server_args
from tests.v1.distributed.test_dp_serve import engine_metric
from tests.v1.distributed.test_ray_dp_serve import _cluster_env, _start


def test_moe_dp2_on_two_ray_nodes_equals_one_engine(two_node_ray_cluster, tmp_path):
    cluster = two_node_ray_cluster
    model_dir = build_zoo_model("mixtral", str(tmp_path / "mixtral"))
    expected = hf_greedy(model_dir, PROMPTS, MAX_TOKENS)
    args = _server_args(["-dpl", "1", "--data-parallel-backend", "ray", "--api-server-count", "1"])
    srv = _start(model_dir, args, _cluster_env(cluster), str(tmp_path / "serve.log"))
    try:
        srv.wait_until_healthy()
        # One request alone: the other engine joins every forward with a dummy batch.
        assert asyncio.run(_complete_all(srv, PROMPTS[:1])) == expected[:1]
        assert asyncio.run(_complete_all(srv, PROMPTS)) == expected
        per_engine = engine_metric(srv, "vllm:request_success_total")
        assert set(per_engine) == {"0", "1"} and min(per_engine.values()) >= 1, per_engine
    finally:
        code = srv.stop()
    assert code == 0
