"""One two-node Ray cluster for the package's Ray tests (test_ray_dp.py,
test_ray_dp_moe.py, test_ray_dp_serve.py): a cluster costs ~30 s to start on
this machine, so it is started once, on first use, and stopped after the
package's last test."""

from __future__ import annotations

import pytest

from tests.v1.distributed.ray_cluster import RayCluster

# Per node: one DP rank of TP <= 2 (two TP worker bundles and the engine's
# control bundle).
CPUS_PER_NODE = 3


@pytest.fixture(scope="package")
def ray_cluster():
    """Head 127.0.0.2 and one more node, CPUS_PER_NODE each. A test may stop
    the second node (a node failure): `two_node_ray_cluster` replaces it."""
    pytest.importorskip("ray")
    with RayCluster(head_cpus=CPUS_PER_NODE) as cluster:
        cluster.add_node(num_cpus=CPUS_PER_NODE)
        yield cluster


@pytest.fixture
def two_node_ray_cluster(ray_cluster):
    """The shared cluster with two live nodes (a node a previous test stopped
    is replaced by a fresh one, with a new IP: `cluster.nodes[1].ip`), and
    every CPU free (what earlier tests held is released asynchronously)."""
    ray_cluster.replace_dead_nodes()
    ray_cluster.wait_until_idle()
    return ray_cluster
