"""Killing one worker process mid-generation: the caller gets EngineDeadError
within seconds and every process of the engine exits."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.engine.exceptions import EngineDeadError


def _worker_processes(engine_procs: list[psutil.Process]) -> list[psutil.Process]:
    """The workers among the engine core's children (not its resource tracker),
    by the name each process gives itself (forked or spawned alike)."""
    return [
        p for core in engine_procs for p in core.children() if p.name().startswith("VllmWorker")
    ]


def _wait_exited(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Processes still running after `timeout`. Exited children stay zombies
    (not reaped here: the engine's own shutdown joins them)."""
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    running.append(p)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.2)


def test_killed_worker_fails_the_engine_fast(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # core in its own process
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    llm = LLM(
        model=tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=512,
        max_num_seqs=4,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
    )
    engine_procs = [p for p in me.children() if p.pid not in before and p.name() == "EngineCore"]
    workers = _worker_processes(engine_procs)
    assert len(engine_procs) == 1 and len(workers) == 2
    engine_tree = engine_procs + [c for p in engine_procs for c in p.children(recursive=True)]

    result: dict[str, object] = {}

    def generate() -> None:
        prompts = [TokensPrompt(prompt_token_ids=[i + 1] * 8) for i in range(4)]
        try:
            # Far longer than the test: it only ends by the kill below.
            llm.generate(prompts, SamplingParams(max_tokens=480, ignore_eos=True), use_tqdm=False)
            result["outcome"] = "finished"
        except BaseException as e:  # noqa: BLE001 - the outcome is the test
            result["outcome"] = e
        result["at"] = time.monotonic()

    thread = threading.Thread(target=generate, daemon=True)
    thread.start()
    time.sleep(2.0)  # mid-generation
    assert thread.is_alive(), "generation ended before the worker was killed"
    killed_at = time.monotonic()
    os.kill(workers[1].pid, signal.SIGKILL)
    thread.join(timeout=20)
    assert not thread.is_alive(), "generate() hung after a worker died"
    assert isinstance(result["outcome"], EngineDeadError), result["outcome"]
    assert result["at"] - killed_at < 10  # type: ignore[operator]

    # Every engine process exits on its own (no shutdown() call here).
    assert _wait_exited(engine_tree, timeout=15) == []
    with pytest.raises(EngineDeadError):
        llm.generate(
            [TokensPrompt(prompt_token_ids=[1, 2])], SamplingParams(max_tokens=2), use_tqdm=False
        )
