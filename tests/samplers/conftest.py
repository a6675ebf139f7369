"""One engine per model runner, shared by the sampler tests, plus a
transformers model to check it against."""

from __future__ import annotations

import pytest
import torch

# Small enough that every prompt longer than 16 tokens is prefilled in chunks.
MAX_NUM_BATCHED_TOKENS = 16
MAX_MODEL_LEN = 96


@pytest.fixture(scope="session", params=["v1", "v2"])
def runner_llm(request, tiny_model_dir):
    """(runner name, LLM) with the V1 or the V2 model runner, in-process,
    chunked prefill forced, whole-vocabulary logprobs allowed."""
    from vllm import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if request.param == "v2" else "0")
        llm = LLM(
            model=tiny_model_dir("llama"),
            dtype="float32",
            max_model_len=MAX_MODEL_LEN,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_num_seqs=8,
            kv_cache_memory_bytes=8 * 2**20,
            max_logprobs=-1,
            seed=0,
        )
        # (The property reads the variable: check while it is set.)
        assert llm.llm_engine.vllm_config.use_v2_model_runner == (request.param == "v2")
    return request.param, llm


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"), dtype=torch.float32).eval()


def hf_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] float32 log_softmax of transformers' logits:
    row i is the distribution of the token after token_ids[:i + 1]."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([token_ids])).logits[0].to(torch.float32)
    return logits.log_softmax(-1)
