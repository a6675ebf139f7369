"""Expert parallelism at TP=2 (mp executor, gloo): each rank holds whole
experts, half of them (linear placement for Mixtral and Qwen2-MoE with its
shared expert, round-robin for DeepSeek-V2's grouped top-k with MLA), and the
greedy tokens equal transformers' (which the TP=1 zoo tests equal too), with
the longer prompts prefilled in chunks."""

from __future__ import annotations

import pytest

from tests.models.test_model_zoo_tp import check_tp2_greedy_matches_transformers


@pytest.mark.parametrize(
    "kind, placement",
    [("mixtral", "linear"), ("qwen2_moe", "linear"), ("deepseek_v2", "round_robin")],
)
def test_tp2_expert_parallel_greedy_matches_single_engine(tmp_path, kind, placement):
    llm = check_tp2_greedy_matches_transformers(
        kind, str(tmp_path), enable_expert_parallel=True, expert_placement_strategy=placement
    )
    parallel = llm.llm_engine.vllm_config.parallel_config
    assert parallel.enable_expert_parallel
    assert parallel.expert_placement_strategy == placement
