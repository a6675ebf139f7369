"""Expert parallelism at TP=2 (mp executor, gloo): each rank holds whole
experts, half of them (linear placement for Mixtral and Qwen2-MoE with its
shared expert, round-robin for DeepSeek-V2's grouped top-k with MLA), and the
greedy tokens equal transformers' (which the TP=1 zoo tests equal too), with
the longer prompts prefilled in chunks."""

from __future__ import annotations

import pytest

from tests.models.test_model_zoo import MAX_TOKENS, _prompts
from tests.models.zoo_utils import build_zoo_model
from tests.utils import hf_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt


@pytest.mark.parametrize(
    "kind, placement",
    [("mixtral", "linear"), ("qwen2_moe", "linear"), ("deepseek_v2", "round_robin")],
)
def test_tp2_expert_parallel_greedy_matches_single_engine(tmp_path, kind, placement):
    model_dir = build_zoo_model(kind, str(tmp_path))
    expected = hf_greedy(model_dir, _prompts(), MAX_TOKENS)
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        seed=0,
        tensor_parallel_size=2,
        enable_expert_parallel=True,
        expert_placement_strategy=placement,
        enable_prefix_caching=False,
        max_num_batched_tokens=32,
        max_num_seqs=8,
    )
    try:
        parallel = llm.llm_engine.vllm_config.parallel_config
        assert parallel.enable_expert_parallel and parallel.tensor_parallel_size == 2
        sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts()]
        outs = llm.generate(prompts, sp, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outs] == expected
    finally:
        llm.llm_engine.shutdown()
