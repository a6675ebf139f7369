"""Helpers shared by the offline-entrypoint tests."""

from __future__ import annotations

import pytest

from vllm import LLM


def make_inproc_llm(model_dir: str, max_model_len: int = 64) -> LLM:
    """A float32 `LLM` whose engine core runs in this process (so a test can
    reach its scheduler), with a small KV cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return LLM(
            model=model_dir,
            dtype="float32",
            max_model_len=max_model_len,
            kv_cache_memory_bytes=8 * 2**20,
            seed=0,
        )
