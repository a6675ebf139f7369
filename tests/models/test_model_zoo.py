"""The model zoo against transformers: for each architecture a tiny random
float32 checkpoint, `LLM.generate` greedy == transformers' greedy `generate`
over prompts of different lengths, with chunked prefill and with preemption
forced; and the runner the running engine built (V1 or V2) is the one the
seed's rule assigns (dense and whitelisted MoE -> V2; other MoE, hybrid and
attention-free -> V1). The runner is never forced: the default decides."""

from __future__ import annotations

import random

import pytest

from tests.models.zoo_utils import (
    ZOO,
    build_zoo_model,
    preempt_all_at_steps,
    runner_of,
    spy_preemptions,
)
from tests.utils import hf_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

MAX_TOKENS = 24
PROMPT_LENS = (5, 9, 17, 23, 33, 40)

# "chunked" caps a step at 16 tokens, so every prompt longer than that is
# prefilled in chunks; "preempt" gives the cache 10 blocks of 16 tokens for 6
# requests that need up to 4 each, so some must be preempted and recomputed
# (state-space models are preempted by the test instead, and also chunked).
MODES = {
    "chunked": dict(max_num_batched_tokens=16, max_num_seqs=8),
    "preempt": dict(num_gpu_blocks_override=10, max_num_seqs=8),
}
MOE_KINDS = {"mixtral", "qwen2_moe", "granitemoe", "deepseek_v2", "deepseek_v2-lite"}
EXPLICIT_PREEMPT_MODE = dict(max_num_batched_tokens=32, max_num_seqs=8)


def _prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(1, 512) for _ in range(n)] for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def zoo_checkpoint(tmp_path_factory):
    """`zoo_checkpoint(kind)` -> (model dir, transformers' greedy outputs), built once."""
    cache: dict[str, tuple[str, list[list[int]]]] = {}

    def get(kind: str) -> tuple[str, list[list[int]]]:
        if kind not in cache:
            model_dir = build_zoo_model(kind, str(tmp_path_factory.mktemp(f"zoo-{kind}")))
            cache[kind] = (model_dir, hf_greedy(model_dir, _prompts(), MAX_TOKENS))
        return cache[kind]

    return get


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", list(ZOO))
def test_greedy_matches_transformers_on_seed_runner(zoo_checkpoint, monkeypatch, kind, mode):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the worker
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)  # the default decides
    model_dir, expected = zoo_checkpoint(kind)
    explicit = mode == "preempt" and ZOO[kind].preempt_explicitly
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        seed=0,
        enable_prefix_caching=False,
        **(EXPLICIT_PREEMPT_MODE if explicit else MODES[mode]),
    )
    model_config = llm.llm_engine.vllm_config.model_config
    assert model_config.architectures == [ZOO[kind].model_cls]
    # Derived from the checkpoint's expert count, as upstream does.
    assert model_config.is_moe == (kind in MOE_KINDS)
    assert runner_of(llm) == ZOO[kind].runner
    preempted = spy_preemptions(llm)
    if explicit:
        # Mid-prefill and mid-decode: the states must be rebuilt from zeros.
        preempt_all_at_steps(llm, {2, 10})
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in _prompts()], sp, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    if mode == "preempt":
        assert preempted, "the small KV cache was meant to force preemption"


def _held_blocks(llm: LLM) -> int:
    """Non-null blocks the running requests hold, over all KV cache groups."""
    coordinator = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.coordinator
    return sum(
        sum(not b.is_null for b in blocks)
        for manager in coordinator.single_type_managers
        for blocks in manager.req_to_blocks.values()
    )


def test_sliding_window_frees_blocks_out_of_the_window(tmp_path, monkeypatch):
    """Gemma 2 with every layer sliding (window 12, blocks of 16): over a
    110-token generation a request never holds more than the blocks its
    window spans, while full attention would need ceil(120 / 16) = 8."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir = build_zoo_model("gemma2-sliding", str(tmp_path))
    llm = LLM(
        model=model_dir, dtype="float32", max_model_len=128, seed=0, enable_prefix_caching=False
    )
    group = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    assert [type(g.kv_cache_spec).__name__ for g in group] == ["SlidingWindowSpec"]
    held: list[int] = []
    core = llm.llm_engine.engine_core.engine_core
    real_step = core.step_fn

    def step():
        result = real_step()
        held.append(_held_blocks(llm))
        return result

    core.step_fn = step
    prompt = _prompts()[2][:10]
    sp = SamplingParams(temperature=0.0, max_tokens=110, ignore_eos=True)
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
    assert out[0].outputs[0].token_ids == hf_greedy(model_dir, [prompt], 110)[0]
    # The window (12 tokens) touches at most 2 blocks, plus the block being filled.
    assert len(held) > 100 and max(held) <= 3


def test_mla_caches_only_the_compressed_latent(zoo_checkpoint, monkeypatch):
    """DeepSeek-V2's KV cache is one MLA group whose rows are kv_lora_rank +
    qk_rope_head_dim wide (32 + 8 here), one per token, instead of
    2 * heads * head_dim for K and V; the allocated tensors have that shape."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir, expected = zoo_checkpoint("deepseek_v2")
    llm = LLM(
        model=model_dir, dtype="float32", max_model_len=128, seed=0, num_gpu_blocks_override=24
    )
    core = llm.llm_engine.engine_core.engine_core
    (group,) = core.scheduler.kv_cache_config.kv_cache_groups
    spec = group.kv_cache_spec
    assert type(spec).__name__ == "MLAAttentionSpec"
    assert (spec.num_kv_heads, spec.head_size) == (1, 32 + 8)
    assert spec.page_size_bytes == 16 * 40 * 4  # block_size * row * float32
    runner = core.model_executor.driver_worker.worker.model_runner
    assert {tuple(t.shape) for t in runner.kv_caches} == {(24, 16, 40)}
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in _prompts()], sp, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected


@pytest.mark.parametrize("kind,flags", [("qwen3_5", (True, False)), ("mamba", (False, True))])
def test_state_space_models_flags_and_kv_cache_groups(zoo_checkpoint, monkeypatch, kind, flags):
    """The flags come from the model class and the checkpoint (is_hybrid,
    is_attention_free), and the engine plans one KV cache group per layer
    kind: Qwen3.5 gets a paged full-attention group for its attention layer
    and a state-slot group for its three Gated DeltaNet layers; Mamba only
    the state-slot group."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir, _ = zoo_checkpoint(kind)
    llm = LLM(model=model_dir, dtype="float32", max_model_len=128, seed=0)
    config = llm.llm_engine.vllm_config
    assert (config.model_config.is_hybrid, config.model_config.is_attention_free) == flags
    assert not config.model_config.is_moe
    groups = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    kinds = [
        (type(g.kv_cache_spec).__name__, len(g.layer_names), g.kv_cache_spec.block_size)
        for g in groups
    ]
    if kind == "qwen3_5":
        assert kinds == [("FullAttentionSpec", 1, 16), ("MambaSpec", 3, 128)]
    else:
        assert kinds == [("MambaSpec", 2, 128)]
    assert runner_of(llm) == "v1"
