"""A Ray cluster of several "nodes" on this one machine, for the multi-node tests.

Each node is one `ray start --block` process in its own session, so that it
and everything it started can be stopped by its own process group, never by
`ray stop` (which stops every Ray process on the machine, including other
test sessions' clusters). Nodes differ by IP address, all loopback (all of
127/8 is loopback on Linux): the head is 127.0.0.2 (Ray rewrites 127.0.0.1
to the host's external address), the others 127.0.0.3, 127.0.0.4, ..., so
Ray names them `node:127.0.0.2`, ... as on a real multi-node cluster, and
upstream's placement by `node:<ip>` works unchanged. A driver on this
machine attaches to the head node; vLLM's DP master address is the head's
(`HEAD_IP`: -dpa, or VLLM_HOST_IP for the Ray backend's default).

Usage (the tests share one two-node cluster per package: conftest.py's
`ray_cluster`; starting one costs ~30 s here):

    with RayCluster(head_cpus=3) as cluster:
        node = cluster.add_node(num_cpus=3)
        ... cluster.address ...          # for RAY_ADDRESS / ray.init
        cluster.stop_node(node)          # a node failure
        cluster.replace_dead_nodes()     # a fresh node (a new IP) for the next test
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from vllm.distributed.utils import get_open_port

RAY_CLI = os.path.join(os.path.dirname(sys.executable), "ray")
START_TIMEOUT_S = 120.0
HEAD_IP = "127.0.0.2"
STOP_TIMEOUT_S = 5.0


def ray_env() -> dict[str, str]:
    """The environment for `ray start` and for drivers of this cluster:
    Ray >= 2.50 may turn on token auth for `ray start` clusters; this one is
    local and throw-away."""
    return os.environ | {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


# `wait_until_idle`'s driver (argv: address, timeout in s): exit 0 once every
# node's CPUs are all free, else 1 with what holds them.
_IDLE_CHECK = """
import json, sys, time, ray
from ray._private.state import available_resources_per_node as avail
from ray.util.placement_group import placement_group_table
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
total = {n["NodeID"]: n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]}
deadline = time.monotonic() + float(sys.argv[2])
while True:
    free = {k: v.get("CPU", 0) for k, v in avail().items()}
    if all(free.get(k, 0) >= v for k, v in total.items()):
        sys.exit(0)
    if time.monotonic() > deadline:
        groups = placement_group_table().values()
        held = [(g.get("name"), g["state"]) for g in groups if g["state"] != "REMOVED"]
        print(json.dumps({"free": free, "total": total, "groups": held}))
        sys.exit(1)
    time.sleep(0.5)
"""


@dataclass
class RayNode:
    ip: str
    proc: subprocess.Popen
    log_path: str

    def log_tail(self, n: int = 4000) -> str:
        with contextlib.suppress(OSError), open(self.log_path) as f:
            return f.read()[-n:]
        return ""


class RayCluster:
    """A head node plus `add_node()` nodes; `shutdown()` stops all of them."""

    def __init__(self, head_cpus: int = 2) -> None:
        # A short temp dir: Ray's unix socket paths live under it (108-byte limit).
        self.temp_dir = tempfile.mkdtemp(prefix="vr", dir="/tmp")
        self.port = get_open_port()
        self.num_cpus: dict[str, int] = {HEAD_IP: head_cpus}
        self.address = f"{HEAD_IP}:{self.port}"
        self.nodes: list[RayNode] = []
        self._next_host = 3  # the last byte of the next node's IP
        try:
            head = self._start(
                [
                    "--head",
                    f"--port={self.port}",
                    f"--node-ip-address={HEAD_IP}",
                    "--include-dashboard=false",
                ],
                head_cpus,
                HEAD_IP,
            )
            self.nodes.append(head)
            self._wait_for_port(head)
            self._wait_for_nodes()
        except BaseException:
            self.shutdown()
            raise

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def add_node(self, num_cpus: int = 2) -> RayNode:
        node = self._start_node(num_cpus)
        self.nodes.append(node)
        self._wait_for_nodes()
        return node

    def _start_node(self, num_cpus: int) -> RayNode:
        # Never an IP used before: the GCS may still list a stopped node as
        # alive for a while.
        ip = f"127.0.0.{self._next_host}"
        self._next_host += 1
        self.num_cpus[ip] = num_cpus
        return self._start([f"--address={self.address}", f"--node-ip-address={ip}"], num_cpus, ip)

    def replace_dead_nodes(self) -> None:
        """Start a new node (same CPUs, a new IP) in place of each stopped one,
        so that a test after a node-failure test finds the cluster whole."""
        dead = [i for i, n in enumerate(self.nodes) if i > 0 and n.proc.poll() is not None]
        for i in dead:
            self.nodes[i] = self._start_node(self.num_cpus[self.nodes[i].ip])
        if dead:
            self._wait_for_nodes()

    def _start(self, args: list[str], num_cpus: int, ip: str) -> RayNode:
        log_path = os.path.join(self.temp_dir, f"{ip}.log")
        cmd = [RAY_CLI, "start", "--block", f"--num-cpus={num_cpus}", "--disable-usage-stats"]
        if "--head" in args:
            cmd.append(f"--temp-dir={self.temp_dir}")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                cmd + args,
                env=ray_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop_node kills it all
            )
        return RayNode(ip=ip, proc=proc, log_path=log_path)

    def _wait_for_port(self, head: RayNode) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if head.proc.poll() is not None:
                raise RuntimeError(f"ray start --head exited:\n{head.log_tail()}")
            with contextlib.suppress(OSError):
                socket.create_connection((HEAD_IP, self.port), timeout=1).close()
                return
            time.sleep(0.2)
        raise TimeoutError(f"Ray head did not listen within {START_TIMEOUT_S}s")

    def alive_node_ips(self) -> list[str]:
        """IPs of the alive nodes, head first (from the GCS, via a short-lived
        driver in a subprocess so that this process never becomes a driver)."""
        code = (
            "import ray\n"
            f"ray.init(address={self.address!r}, log_to_driver=False, logging_level='ERROR')\n"
            "nodes = [n for n in ray.nodes() if n['Alive']]\n"
            "nodes.sort(key=lambda n: 'node:__internal_head__' not in n['Resources'])\n"
            "print(' '.join(n['NodeManagerAddress'] for n in nodes))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=ray_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.split()

    def wait_until_idle(self, timeout_s: float = 60.0) -> None:
        """Until every node's CPUs are all available again: a previous test's
        engines and placement groups are released asynchronously (the GCS
        frees a removed group's bundles on the raylet later, slower under
        load), and a test that reserves "the whole cluster" must not see them.
        Raises TimeoutError naming what still holds CPUs (a real leak)."""
        out = subprocess.run(
            [sys.executable, "-c", _IDLE_CHECK, self.address, str(timeout_s)],
            env=ray_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s + 60,
        )
        if out.returncode != 0:
            raise TimeoutError(
                f"Ray cluster CPUs still held {timeout_s:.0f} s after the previous test: "
                f"{out.stdout.strip() or out.stderr[-2000:]}"
            )

    def _wait_for_nodes(self) -> None:
        """Until the GCS lists every node whose `ray start` still runs."""
        live = [n for n in self.nodes if n.proc.poll() is None]
        want = {n.ip for n in live}
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in live:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"ray start exited:\n{node.log_tail()}")
            if want <= set(self.alive_node_ips()):
                return
            time.sleep(0.5)
        raise TimeoutError(f"Ray nodes {sorted(want)} not alive within {START_TIMEOUT_S}s")

    def stop_node(self, node: RayNode, sig: int = signal.SIGKILL) -> None:
        """Stop one node: its `ray start` process and every process of its group
        (raylet, its workers and actors). SIGKILL = a node failure."""
        _kill_group(node.proc, sig)

    def shutdown(self) -> None:
        """Stop every node (workers first, the head last), remove the temp dir."""
        for node in reversed(self.nodes):
            _kill_group(node.proc, signal.SIGTERM)
        self.nodes = []
        if not os.environ.get("KEEP_RAY_LOGS"):
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Ray starts its workers in their own
    sessions, so the process group alone does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process group `proc` leads and all its descendants, wait
    briefly, then SIGKILL what is left."""
    if proc.poll() is not None:
        return
    tree = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_TIMEOUT_S)
    # Ray's daemons may outlive the `ray start --block` process: kill them all.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
