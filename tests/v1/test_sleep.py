"""Sleep mode offline: `LLM.sleep` / `LLM.wake_up` (upstream: tests/basic_correctness/
test_cumem.py's test_end_to_end, on this build's CPU path).

Level 1 gives back the KV cache, level 2 the weights too; greedy outputs after
wake-up equal those before. The engine core runs in its own process (the LLM
default) with MALLOC_MMAP_THRESHOLD_=1 MiB. The CPU KV cache is anonymous
memory faulted in as it fills, so its release shows in the engine's virtual
size (the mapping goes away), not in its resident set (see
tests/entrypoints/openai/test_dev_mode.py).
"""

from __future__ import annotations

import psutil
import pytest

from vllm import LLM, SamplingParams

MiB = 2**20
KV_BYTES = 128 * MiB
PROMPTS = ["The quick brown fox", "def hello(world):"]
GREEDY = SamplingParams(temperature=0, max_tokens=8)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        mp.setenv("MALLOC_MMAP_THRESHOLD_", str(MiB))
        engine = LLM(
            tiny_model_dir("llama"),
            dtype="float32",
            max_model_len=128,
            kv_cache_memory_bytes=KV_BYTES,
            enable_sleep_mode=True,
        )
    yield engine
    engine.llm_engine.shutdown()


def _tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _core_vms() -> int:
    children = psutil.Process().children(recursive=True)
    return sum(
        p.memory_info().vms for p in children if "resource_tracker" not in " ".join(p.cmdline())
    )


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_wake_up_keeps_greedy_outputs(llm, level):
    reference = _tokens(llm)
    before = _core_vms()
    llm.sleep(level)
    assert llm.llm_engine.is_sleeping()
    freed = before - _core_vms()
    assert freed >= 0.9 * KV_BYTES, f"level {level} freed {freed / MiB:.0f} MiB"
    # Nothing is scheduled while asleep: refused rather than waiting forever.
    with pytest.raises(RuntimeError, match="sleeping"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.wake_up()
    assert not llm.llm_engine.is_sleeping()
    assert _tokens(llm) == reference


def test_wake_up_in_parts(llm):
    reference = _tokens(llm)
    llm.sleep(2)
    llm.wake_up(["kv_cache"])
    assert llm.llm_engine.is_sleeping()  # the weights still sleep
    llm.wake_up(["weights"])
    assert not llm.llm_engine.is_sleeping()
    assert _tokens(llm) == reference


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda llm: llm.sleep(3), "level"),
        (lambda llm: llm.sleep(True), "level"),
        (lambda llm: llm.sleep(1, mode="bogus"), "mode"),
        (lambda llm: llm.wake_up(["bogus"]), "tags"),
    ],
)
def test_bad_arguments_are_refused(llm, call, match):
    with pytest.raises(ValueError, match=match):
        call(llm)
    assert not llm.llm_engine.is_sleeping()


def test_sleep_needs_enable_sleep_mode(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    plain = LLM(
        tiny_model_dir("llama"), dtype="float32", max_model_len=64, kv_cache_memory_bytes=4 * MiB
    )
    try:
        with pytest.raises(ValueError, match="enable_sleep_mode"):
            plain.sleep(1)
        with pytest.raises(ValueError, match="enable_sleep_mode"):
            plain.wake_up()
    finally:
        plain.llm_engine.shutdown()


def test_sleep_in_process(tiny_model_dir, monkeypatch):
    """The in-process core (InprocClient) sleeps and wakes the same way."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    inproc = LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=4 * MiB,
        enable_sleep_mode=True,
    )
    try:
        reference = _tokens(inproc)
        runner = inproc.llm_engine.model_executor.driver_worker.worker.model_runner
        inproc.sleep(2)
        assert runner.kv_caches == []
        assert all(p.numel() == 0 for p in runner.get_model().parameters())
        inproc.wake_up()
        assert _tokens(inproc) == reference
    finally:
        inproc.llm_engine.shutdown()


def test_sleep_with_tensor_parallelism(tiny_model_dir, monkeypatch):
    """tp=2 (MultiprocExecutor): every worker frees and reloads its shard."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    tp = LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=4 * MiB,
        enable_sleep_mode=True,
        tensor_parallel_size=2,
    )
    try:
        reference = _tokens(tp)
        tp.sleep(2)
        assert tp.llm_engine.is_sleeping()
        tp.wake_up()
        assert _tokens(tp) == reference
    finally:
        tp.llm_engine.shutdown()


def test_what_cannot_sleep_is_refused_before_anything_is_freed(tiny_model_dir):
    """CUDA graphs keep the addresses sleep would free; a compiled model keeps
    weights that level 2's reload would not reach (worker_sleep.py)."""
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.core_sleep import validate_sleep_args

    config = EngineArgs(
        tiny_model_dir("llama"), max_model_len=64, enable_sleep_mode=True
    ).create_engine_config()
    validate_sleep_args(config, 2, "abort")
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    with pytest.raises(ValueError, match="CUDA graphs.*--enforce-eager"):
        validate_sleep_args(config, 1, "abort")
    config.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    config.compilation_config.mode = CompilationMode(3)
    validate_sleep_args(config, 1, "abort")
    with pytest.raises(ValueError, match="level 2"):
        validate_sleep_args(config, 2, "abort")


def test_mode_wait_offline(llm):
    """LLM steps its requests itself: "wait" sleeps at once when none is in
    flight, and is refused (not deadlocked) while one is."""
    reference = _tokens(llm)
    engine = llm.llm_engine
    engine.add_request("in-flight", "Hello", GREEDY)
    with pytest.raises(ValueError, match="wait"):
        llm.sleep(1, mode="wait")
    while engine.has_unfinished_requests():
        engine.step()
    llm.sleep(1, mode="wait")
    assert engine.is_sleeping()
    llm.wake_up()
    assert _tokens(llm) == reference


@pytest.mark.parametrize("level", [0, 1])
def test_mode_keep_resumes_the_requests_in_flight(llm, level):
    """Mode "keep": a running request is paused (preempted at level 1) and
    resumes after wake-up with the tokens it would have had anyway."""
    reference = _tokens(llm)[0]
    engine = llm.llm_engine
    engine.add_request("kept", PROMPTS[0], GREEDY)
    tokens: list[int] = []
    for out in engine.step() + engine.step():
        tokens = list(out.outputs[0].token_ids)
    assert engine.has_unfinished_requests()
    llm.sleep(level, mode="keep")
    with pytest.raises(RuntimeError, match="sleeping"):
        engine.step()
    llm.wake_up()
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens = list(out.outputs[0].token_ids)
    assert tokens == reference


def test_mode_keep_under_async_scheduling(tiny_model_dir, monkeypatch):
    """With a step in flight (async scheduling's batch queue) "keep" first
    finishes it, scheduling nothing new, then preempts."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    inproc = LLM(
        tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=4 * MiB,
        enable_sleep_mode=True,
        async_scheduling=True,
    )
    try:
        reference = _tokens(inproc)[0]
        engine = inproc.llm_engine
        engine.add_request("kept", PROMPTS[0], GREEDY)
        tokens: list[int] = []
        for out in engine.step() + engine.step() + engine.step():
            tokens = list(out.outputs[0].token_ids)
        assert engine.engine_core.engine_core.batch_queue  # a step is in flight
        inproc.sleep(1, mode="keep")
        inproc.wake_up()
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens = list(out.outputs[0].token_ids)
        assert tokens == reference
    finally:
        engine.shutdown()
