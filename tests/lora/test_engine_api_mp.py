"""The LoRA engine API with the engine core in its own process (issue 18
item 1): through SyncMPClient (LLM's default) and AsyncLLM (the server's
engine) a LoRARequest crosses msgpack as a utility argument and inside
EngineCoreRequest, add_lora / remove_lora / list_loras / pin_lora work, a bad
adapter raises its typed error to the caller with nothing loaded, and a
request sent past the front end with a bad adapter fails alone."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.lora.test_engine_api_engines import (
    ENGINE_KWARGS,
    GREEDY,
    PROMPT,
    _lora,
    _make_llm,
    _tokens,
    make_adapters,
)
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest
from vllm.v1.engine.async_llm import AsyncLLM


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    return make_adapters(tiny_model_dir("llama"), str(tmp_path_factory.mktemp("lora-adapters")))


def test_engine_core_in_its_own_process(adapters):
    """The same API through SyncMPClient: LoRARequest crosses msgpack as a
    utility argument and inside EngineCoreRequest; errors keep their type."""
    llm = _make_llm(adapters, multiprocessing=True)
    try:
        engine = llm.llm_engine
        a, b = _lora(adapters, "a", 1), _lora(adapters, "b", 2)
        assert engine.add_lora(a) is True and engine.list_loras() == {1}
        outs = llm.generate([PROMPT] * 3, GREEDY, use_tqdm=False, lora_request=[a, None, b])
        mixed = [list(o.outputs[0].token_ids) for o in outs]
        reference = {"a": _tokens(llm, a), "base": _tokens(llm), "b": _tokens(llm, b)}
        assert mixed == [reference["a"], reference["base"], reference["b"]]
        assert len({tuple(t) for t in mixed}) == 3  # each adapter changes the output
        assert engine.list_loras() == {1, 2} and engine.pin_lora(2) is True
        for name, error in (("rank16", ValueError), ("not_peft", LoRAAdapterNotFoundError)):
            with pytest.raises(error):
                _tokens(llm, _lora(adapters, name, 7))
        assert engine.remove_lora(1) is True and engine.list_loras() == {2}
        # Sent past the front end: the core fails that request alone.
        bad = LoRARequest("gone", 41, os.path.join(adapters["not_peft"], "gone"))
        request = engine.input_processor.process_inputs("direct", PROMPT, GREEDY, lora_request=bad)
        engine.input_processor.assign_request_id(request)
        engine.output_processor.add_request(request, None, None, 0)
        engine.engine_core.add_request(request)
        outputs = []
        while engine.has_unfinished_requests():
            outputs += engine.step()
        assert [o.outputs[0].finish_reason for o in outputs] == ["error"]
        assert _tokens(llm, a) == reference["a"]
    finally:
        llm.llm_engine.shutdown()


# ---- AsyncLLM (the server's engine) -------------------------------------------------------


async def _generate(engine: AsyncLLM, request_id: str, lora: LoRARequest | None) -> list[int]:
    final = None
    async for out in engine.generate(PROMPT, GREEDY, request_id, lora_request=lora):
        final = out
    assert final is not None
    return list(final.outputs[0].token_ids)


def test_async_llm_lora_api(adapters):
    args = AsyncEngineArgs(model=adapters["base"], enable_lora=True, max_loras=2, **ENGINE_KWARGS)
    a, b = _lora(adapters, "a", 1), _lora(adapters, "b", 2)

    async def run() -> None:
        engine = AsyncLLM.from_engine_args(args)
        try:
            assert await engine.add_lora(a) is True
            assert await engine.list_loras() == {1}
            assert await engine.pin_lora(1) is True
            # Concurrent requests over both adapters and the base model.
            tokens = await asyncio.gather(
                _generate(engine, "a", a), _generate(engine, "b", b), _generate(engine, "c", None)
            )
            assert await engine.list_loras() == {1, 2}  # b loaded by its request
            assert tokens[0] != tokens[2] and tokens[1] != tokens[2] and tokens[0] != tokens[1]
            solo = [await _generate(engine, f"s{i}", x) for i, x in enumerate((a, b, None))]
            assert solo == tokens
            missing = LoRARequest("missing", 9, os.path.join(adapters["not_peft"], "none"))
            with pytest.raises(LoRAAdapterNotFoundError, match="No adapter found for"):
                await _generate(engine, "bad", missing)
            with pytest.raises(LoRAAdapterNotFoundError):
                await engine.add_lora(missing)
            assert await engine.remove_lora(2) is True
            assert await engine.list_loras() == {1}
            assert await _generate(engine, "again", b) == tokens[1]  # reloaded
            assert engine.get_num_unfinished_requests() == 0
        finally:
            engine.shutdown()
            await asyncio.sleep(0.1)

    asyncio.run(run())
