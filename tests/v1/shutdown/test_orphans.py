"""`LLM` runs its engine core in a child process by default; however the
front end goes away (normal exit without shutdown(), or SIGKILL), the engine
core does not outlive it."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from tests.entrypoints.openai.conftest import REPO_ROOT, wait_exited

SCRIPT = """
import os, signal, sys
from vllm import LLM, SamplingParams
from vllm.v1.engine.core_client_mp import SyncMPClient
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=64,
          kv_cache_memory_bytes=8 * 2**20)
client = llm.llm_engine.engine_core
assert isinstance(client, SyncMPClient), type(client)
out = llm.generate(["hello"], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
assert len(out[0].outputs[0].token_ids) == 4
print(client.resources.engine_manager.processes[0].pid, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_engine_core_does_not_outlive_front_end(tiny_model_dir, how):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_model_dir("llama"), how],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == (0 if how == "exit" else -9), proc.stderr[-2000:]
    (engine_pid,) = [int(line) for line in proc.stdout.splitlines() if line.isdigit()]
    try:
        engine = psutil.Process(engine_pid)
    except psutil.NoSuchProcess:
        return  # already gone
    wait_exited([engine], timeout=15)
