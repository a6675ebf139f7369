"""AsyncLLM.encode (what the server's pooling endpoints will call): pooling
requests submitted concurrently from asyncio each get their one final output,
equal to sentence-transformers' embedding; the engine reports the pooler's
tasks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.models.language.pooling.st_utils import make_st_dir
from vllm import PoolingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.outputs import PoolingRequestOutput
from vllm.v1.engine.async_llm import AsyncLLM

TEXTS = ["The quick brown fox.", "Paged attention stores keys and values. " * 4, "def f(x):"]


def test_async_encode_concurrent_requests(tmp_path):
    from sentence_transformers import SentenceTransformer

    st_dir = make_st_dir("qwen3", str(tmp_path / "st"), "lasttoken", seed=5)
    args = AsyncEngineArgs(
        model=st_dir, dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 26
    )

    async def run() -> tuple[tuple[str, ...], list[PoolingRequestOutput]]:
        engine = AsyncLLM.from_engine_args(args)
        try:
            tasks = await engine.get_supported_tasks()

            async def one(i: int, text: str) -> PoolingRequestOutput:
                params = PoolingParams()
                params.verify("embed", engine.model_config)
                outs = [o async for o in engine.encode(text, params, request_id=f"r{i}")]
                assert len(outs) == 1 and outs[0].finished
                return outs[0]

            results = await asyncio.gather(*(one(i, t) for i, t in enumerate(TEXTS)))
            return tasks, list(results)
        finally:
            engine.shutdown()

    tasks, results = asyncio.run(run())
    assert tasks == ("embed", "token_embed")
    assert [r.request_id for r in results] == ["r0", "r1", "r2"]
    got = torch.stack([r.outputs.data for r in results])
    ref = torch.as_tensor(SentenceTransformer(st_dir, device="cpu").encode(TEXTS))
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert bool((cos >= 0.9999).all()), cos


def test_async_encode_refuses_a_generative_model(tiny_model_dir):
    args = AsyncEngineArgs(
        model=tiny_model_dir("qwen3"), dtype="float32", max_model_len=256,
        kv_cache_memory_bytes=1 << 26,
    )  # fmt: skip

    async def run() -> None:
        engine = AsyncLLM.from_engine_args(args)
        try:
            params = PoolingParams()
            params.verify("embed", None)
            with pytest.raises(ValueError, match="is not a pooling model"):
                async for _ in engine.encode("hi", params, request_id="x"):
                    pass
        finally:
            engine.shutdown()

    asyncio.run(run())
