"""Tensor parallelism over the zoo: dense models (OPT; GPT-2, whose fused
c_attn is split into per-rank q/k/v heads on load) and MoE models (Qwen2-MoE:
experts sliced along their intermediate size, shared expert, all-reduced;
DeepSeek-V2: MLA heads split across ranks, grouped top-k) at TP=2 generate
exactly transformers' greedy tokens, with the longer prompts prefilled in
chunks of 32 tokens."""

from __future__ import annotations

import pytest

from tests.models.test_model_zoo import MAX_TOKENS, _prompts
from tests.models.zoo_utils import build_zoo_model
from tests.utils import hf_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


def check_tp2_greedy_matches_transformers(kind: str, out_dir: str, **engine_kwargs) -> LLM:
    """A zoo model at TP=2 (plus `engine_kwargs`) generates transformers'
    greedy tokens, prompts longer than 32 tokens prefilled in chunks; returns
    the engine, already shut down (its config stays readable). Shared with
    tests/distributed/test_expert_parallel.py."""
    model_dir = build_zoo_model(kind, out_dir)
    expected = hf_greedy(model_dir, _prompts(), MAX_TOKENS)
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        seed=0,
        tensor_parallel_size=2,
        enable_prefix_caching=False,
        max_num_batched_tokens=32,
        max_num_seqs=8,
        **engine_kwargs,
    )
    try:
        assert llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
        sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts()]
        outs = llm.generate(prompts, sp, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outs] == expected
    finally:
        llm.llm_engine.shutdown()
    return llm


@pytest.mark.parametrize("kind", ["opt", "gpt2", "qwen2_moe", "deepseek_v2"])
def test_tp2_greedy_matches_transformers(tmp_path, kind):
    check_tp2_greedy_matches_transformers(kind, str(tmp_path))
