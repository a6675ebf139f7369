"""logprobs_mode="processed_logprobs": the logprobs describe the distribution
actually sampled from (after the logits edits, temperature and top-k), in
both model runners (upstream: tests/v1/sample/test_logprobs.py::test_logprobs_mode)."""

from __future__ import annotations

import math

import pytest
import torch

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

PROMPT = [12, 34, 56, 78, 90, 123, 145]
TEMPERATURE, TOP_K = 2.0, 4


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_processed_logprobs(tiny_model_dir, hf_model, runner, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if runner == "v2" else "0")
    llm = LLM(
        model=tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=8 * 2**20,
        logprobs_mode="processed_logprobs",
        seed=0,
    )
    (out,) = llm.generate(
        TokensPrompt(prompt_token_ids=PROMPT),
        SamplingParams(
            temperature=TEMPERATURE,
            top_k=TOP_K,
            seed=3,
            max_tokens=4,
            ignore_eos=True,
            logprobs=TOP_K,
            logit_bias={7: 1.0},
        ),
        use_tqdm=False,
    )
    completion = out.outputs[0]
    ids = PROMPT + list(completion.token_ids)
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].to(torch.float32)
    for j, token in enumerate(completion.token_ids):
        row = logits[len(PROMPT) - 1 + j].clone()
        row[7] += 1.0
        row /= TEMPERATURE
        keep = row.topk(TOP_K).indices
        masked = torch.full_like(row, float("-inf"))
        masked[keep] = row[keep]
        ref = masked.log_softmax(-1)
        entry = completion.logprobs[j]
        assert token in keep.tolist()
        assert math.isclose(entry[token].logprob, ref[token].item(), abs_tol=1e-4)
        for tid in keep.tolist():
            assert math.isclose(entry[tid].logprob, ref[tid].item(), abs_tol=1e-4)
        # The sampled distribution's top-k carries all its mass.
        assert math.isclose(
            sum(math.exp(entry[t].logprob) for t in keep.tolist()), 1.0, abs_tol=1e-4
        )
