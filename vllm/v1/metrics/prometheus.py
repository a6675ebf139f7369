"""Prometheus across several API server processes (upstream:
vllm/v1/metrics/prometheus.py).

With `--api-server-count N > 1` each API server records its own metrics;
prometheus_client's multiprocess mode keeps them in files under
PROMETHEUS_MULTIPROC_DIR (one set per process), and /metrics in any server
reads them all: counters and histograms summed over the servers, gauges as
their most recent value (`multiprocess_mode="mostrecent"`). The directory
must be set before the servers start (prometheus_client picks its value
store when it is imported), so the parent sets it, in a temporary directory
removed when the parent exits.
"""

from __future__ import annotations

import os
import tempfile

from prometheus_client import REGISTRY, CollectorRegistry, multiprocess

import vllm.envs as envs
from vllm.logger import init_logger

logger = init_logger(__name__)

# The directory this process made (None: none, or the user's own).
_prometheus_multiproc_dir: tempfile.TemporaryDirectory[str] | None = None


def setup_multiprocess_prometheus() -> None:
    """Point PROMETHEUS_MULTIPROC_DIR at a fresh temporary directory (for
    the child processes started after this), unless the user set one."""
    global _prometheus_multiproc_dir
    if envs.PROMETHEUS_MULTIPROC_DIR is None:
        _prometheus_multiproc_dir = tempfile.TemporaryDirectory(prefix="vllm-prometheus-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _prometheus_multiproc_dir.name
        logger.debug("Created PROMETHEUS_MULTIPROC_DIR at %s", _prometheus_multiproc_dir.name)
    else:
        logger.warning(
            "Found PROMETHEUS_MULTIPROC_DIR was set by user. This directory must be wiped "
            "between vLLM runs or you will find inaccurate metrics. Unset the variable and "
            "vLLM will properly handle cleanup."
        )


def get_prometheus_registry() -> CollectorRegistry:
    """The registry /metrics exports: every process's metrics in multiprocess
    mode, else this process's default registry."""
    if envs.PROMETHEUS_MULTIPROC_DIR is not None:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY
