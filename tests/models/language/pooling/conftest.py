"""Fixtures of the pooling model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def in_process_engine():
    """The engine core in this process (several times faster to start on 2
    cores; it also lets a test reach the scheduler). A module opts in with
    `pytestmark = pytest.mark.usefixtures("in_process_engine")`;
    test_async_encode.py covers the multi-process path."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        yield
