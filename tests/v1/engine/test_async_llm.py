"""AsyncLLM end to end on a tiny model (upstream: tests/v1/engine/test_async_llm.py):
load, abort, mid-stream cancellation, request-scoped errors, admission
control, and the engine core dying under it."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, QueueOverflowError

PROMPT = "The quick brown fox jumps over the lazy dog."


def _engine_args(model_dir: str) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=model_dir,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=16 * 2**20,
        enable_prefix_caching=False,
    )


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def engine(loop, tiny_model_dir):
    async def make() -> AsyncLLM:
        return AsyncLLM.from_engine_args(_engine_args(tiny_model_dir("llama")))

    engine = loop.run_until_complete(make())
    yield engine
    engine.shutdown()
    # Let the background tasks see their cancellation before the loop closes.
    loop.run_until_complete(asyncio.sleep(0.1))


def _params(
    max_tokens: int, kind: RequestOutputKind = RequestOutputKind.DELTA, **kwargs
) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, ignore_eos=True, output_kind=kind, temperature=0.0, **kwargs
    )


async def _collect(
    engine: AsyncLLM,
    request_id: str,
    params: SamplingParams,
    cancel_after: int | None = None,
    started: asyncio.Event | None = None,
) -> tuple[int, str | None]:
    """(tokens received, last finish reason); stops iterating after
    `cancel_after` tokens (the generator is closed: an abort)."""
    num_tokens, reason = 0, None
    outputs = engine.generate(PROMPT, params, request_id)
    try:
        async for out in outputs:
            if params.output_kind == RequestOutputKind.DELTA:
                num_tokens += len(out.outputs[0].token_ids)
            else:
                num_tokens = len(out.outputs[0].token_ids)
            reason = out.outputs[0].finish_reason
            assert out.finished == (reason is not None)
            if started is not None:
                started.set()
            if cancel_after is not None and num_tokens >= cancel_after:
                break
    finally:
        await outputs.aclose()
    return num_tokens, reason


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
def test_load(loop, engine, kind):
    """Concurrent requests each get exactly max_tokens; nothing is left behind."""

    async def run():
        results = await asyncio.gather(
            *[_collect(engine, f"load-{i}", _params(8 + i % 3, kind)) for i in range(20)]
        )
        assert [n for n, _ in results] == [8 + i % 3 for i in range(20)]
        assert all(reason == "length" for _, reason in results)
        assert engine.get_num_unfinished_requests() == 0

    loop.run_until_complete(run())


def test_abort(loop, engine):
    """Cancelling some requests leaves the others exact; ids can be reused."""

    async def run():
        started = [asyncio.Event() for _ in range(8)]
        tasks = [
            asyncio.create_task(
                _collect(
                    engine, f"abort-{i}", _params(100 if i in (1, 4) else 30), started=started[i]
                )
            )
            for i in range(8)
        ]
        for i in (1, 4):
            await started[i].wait()
            tasks[i].cancel()
        for i, task in enumerate(tasks):
            if i in (1, 4):
                with pytest.raises(asyncio.CancelledError):
                    await task
            else:
                assert await task == (30, "length")
        assert engine.get_num_unfinished_requests() == 0
        assert await _collect(engine, "abort-1", _params(3)) == (3, "length")

    loop.run_until_complete(run())


def test_mid_stream_cancellation(loop, engine):
    async def run():
        n, reason = await _collect(engine, "mid", _params(40), cancel_after=5)
        # A slow consumer gets the deltas produced meanwhile merged into one
        # output (as upstream's RequestOutputCollector), so the 5th token may
        # arrive together with the next few; the request still never finishes.
        assert 5 <= n < 40 and reason is None
        assert engine.get_num_unfinished_requests() == 0

    loop.run_until_complete(run())


def test_explicit_abort_gives_final_abort_output(loop, engine):
    async def run():
        outputs = []

        async def consume():
            async for out in engine.generate(PROMPT, _params(60), "explicit"):
                outputs.append(out)

        task = asyncio.create_task(consume())
        while not outputs:
            await asyncio.sleep(0.05)
        await engine.abort(["explicit"])
        await task
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "abort"
        assert sum(len(o.outputs[0].token_ids) for o in outputs) > 0
        assert engine.get_num_unfinished_requests() == 0

    loop.run_until_complete(run())


def test_request_scoped_errors(loop, engine):
    """Bad input fails that request only (upstream: test_processor_error)."""

    async def run():
        for i in range(3):
            with pytest.raises(ValueError):
                async for _ in engine.generate(
                    TokensPrompt(prompt_token_ids=[]), _params(5), f"bad-{i}"
                ):
                    pass
        with pytest.raises(ValueError, match="min_tokens"):
            # max_tokens unset: it becomes the room left in the context (< 600).
            async for _ in engine.generate(
                PROMPT, SamplingParams(min_tokens=600, max_tokens=None), "bad-min"
            ):
                pass
        assert not engine.errored
        assert await _collect(engine, "good", _params(5)) == (5, "length")

    loop.run_until_complete(run())


def test_parallel_sampling(loop, engine):
    async def run():
        params = SamplingParams(
            n=2,
            max_tokens=6,
            ignore_eos=True,
            temperature=1.0,
            seed=3,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        outs = [o async for o in engine.generate(PROMPT, params, "par")]
        assert len(outs) == 1 and outs[0].finished
        assert sorted(c.index for c in outs[0].outputs) == [0, 1]
        assert all(len(c.token_ids) == 6 for c in outs[0].outputs)

    loop.run_until_complete(run())


def test_admission_control(loop, engine):
    async def run():
        engine.max_num_queued_reqs = 3
        try:
            started = [asyncio.Event() for _ in range(3)]

            def launch(i: int) -> asyncio.Task:
                return asyncio.create_task(
                    _collect(engine, f"q-{i}", _params(400), started=started[i])
                )

            tasks = [launch(0), launch(1)]
            await started[0].wait()
            await started[1].wait()
            # One slot left: n=2 needs two and is refused as a whole.
            with pytest.raises(QueueOverflowError, match="try again"):
                await _collect(engine, "q-n", _params(2, n=2, seed=1))
            assert engine.get_num_unfinished_requests() == 2
            tasks.append(launch(2))
            await started[2].wait()
            with pytest.raises(QueueOverflowError):
                await _collect(engine, "q-over", _params(2))
            assert [await t for t in tasks] == [(400, "length")] * 3
            assert await _collect(engine, "q-after", _params(2)) == (2, "length")
        finally:
            engine.max_num_queued_reqs = None

    loop.run_until_complete(run())


def test_engine_death(loop, tiny_model_dir):
    """The core dies mid-request: every caller gets EngineDeadError."""

    async def run():
        engine = AsyncLLM.from_engine_args(_engine_args(tiny_model_dir("llama")))
        try:
            started = [asyncio.Event() for _ in range(4)]
            tasks = [
                asyncio.create_task(_collect(engine, f"d-{i}", _params(450), started=started[i]))
                for i in range(4)
            ]
            for event in started:
                await event.wait()
            proc = engine.engine_core.resources.engine_manager.processes[0]
            os.kill(proc.pid, signal.SIGKILL)
            for task in tasks:
                with pytest.raises(EngineDeadError):
                    await asyncio.wait_for(task, timeout=10)
            assert engine.errored
            with pytest.raises(EngineDeadError):
                await _collect(engine, "after-death", _params(2))
            with pytest.raises(EngineDeadError):
                await engine.check_health()
        finally:
            engine.shutdown()
        assert not proc.is_alive()

    loop.run_until_complete(run())
