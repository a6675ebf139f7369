"""Greedy parity with transformers' own `generate` on tiny random models,
through the whole engine (scheduler, paged KV cache, V1 model runner), with
prefix caching on and off, forced chunked prefill, and forced preemption."""
from __future__ import annotations

import random

import pytest

from tests.conftest import TINY_KINDS
from tests.utils import hf_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

MAX_TOKENS = 32
PROMPT_LENS = (5, 9, 17, 23, 33, 40, 47, 63)

# Engine settings per mode. "preempt" gives the cache 12 blocks of 16 tokens
# for 8 requests that need ~5 blocks each, so requests must be preempted and
# recomputed; "chunked" caps a step at 16 tokens, so every prompt longer than
# that is prefilled in chunks.
MODES = {
    "prefix_cache": dict(enable_prefix_caching=True),
    "no_prefix_cache": dict(enable_prefix_caching=False),
    "chunked": dict(max_num_batched_tokens=16, max_num_seqs=8, enable_prefix_caching=True),
    "preempt": dict(num_gpu_blocks_override=12, max_num_seqs=8, enable_prefix_caching=True),
}


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    shared = [rng.randrange(1, 512) for _ in range(32)]  # a 2-block common prefix
    prompts = []
    for i, n in enumerate(PROMPT_LENS):
        own = [rng.randrange(1, 512) for _ in range(n)]
        prompts.append((shared + own)[:n] if i % 2 and n > 32 else own)
    return prompts


_HF_CACHE: dict[str, list[list[int]]] = {}


def _expected(model_dir: str, kind: str) -> list[list[int]]:
    if kind not in _HF_CACHE:
        _HF_CACHE[kind] = hf_greedy(model_dir, _prompts(), MAX_TOKENS)
    return _HF_CACHE[kind]


def _spy_preemptions(llm: LLM) -> list[str]:
    """Record the ids the in-process scheduler preempts (behaviour unchanged)."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    preempted: list[str] = []
    real = scheduler._preempt_request

    def spy(request, *args, **kwargs):
        preempted.append(request.request_id)
        return real(request, *args, **kwargs)

    scheduler._preempt_request = spy
    return preempted


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", TINY_KINDS)
def test_greedy_matches_transformers(tiny_model_dir, monkeypatch, kind, mode):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the scheduler
    model_dir = tiny_model_dir(kind)
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, seed=0, **MODES[mode])
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    preempted = _spy_preemptions(llm)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts()]
    outs = llm.generate(prompts, sp, use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == _expected(model_dir, kind)
    if mode == "preempt":
        assert preempted, "the small KV cache was meant to force preemption"
