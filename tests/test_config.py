"""The model-runner choice of upstream PR #44443 (the seed) and the
`max_concurrent_batches` rule, tested with the seed's cases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm.config import DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, SchedulerConfig, VllmConfig
from vllm.config.parallel import ParallelConfig


def _model(
    arch: str,
    *,
    runner_type: str = "generate",
    is_moe: bool = False,
    is_quantized: bool = False,
    **flags,
) -> SimpleNamespace:
    return SimpleNamespace(
        model=arch,
        architectures=[arch],
        runner_type=runner_type,
        is_moe=is_moe,
        is_quantized=is_quantized,
        **flags,
    )


# (model config, expected) — the seed's table.
SEED_CASES = [
    (_model("Qwen3ForCausalLM"), True),
    (_model("LlamaForCausalLM"), True),
    (_model("MistralForCausalLM"), True),
    (_model("OPTForCausalLM"), True),
    (_model("Gemma2ForCausalLM"), True),
    (_model("Qwen3ForCausalLM", is_quantized=True), True),  # e.g. Qwen3-1.7B-FP8
    (_model("DeepseekV2ForCausalLM", is_moe=True), True),
    (_model("Qwen2MoeForCausalLM", is_moe=True), True),
    (_model("GraniteMoeForCausalLM", is_moe=True), True),
    (_model("MixtralForCausalLM", is_moe=True), False),  # MoE, not whitelisted
    (_model("Qwen3_5ForConditionalGeneration", is_hybrid=True), False),
    (_model("MambaForCausalLM", is_attention_free=True), False),
    (_model("Qwen3ForCausalLM", runner_type="pooling"), False),  # Qwen3-Embedding
]


@pytest.mark.parametrize(
    "model_config,expected",
    SEED_CASES,
    ids=[c.model + ("-" + c.runner_type) for c, _ in SEED_CASES],
)
def test_is_default_v2_model_runner_model(model_config, expected):
    cfg = VllmConfig()
    cfg.model_config = model_config
    assert cfg._is_default_v2_model_runner_model() is expected


def test_whitelist_is_the_seeds_moe_set():
    seed_moe = {"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"}
    assert frozenset(seed_moe) == DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES


def test_hybrid_moe_is_excluded_even_if_whitelisted():
    # The seed excludes every hybrid model before looking at the whitelist.
    cfg = VllmConfig()
    cfg.model_config = _model("Qwen2MoeForCausalLM", is_moe=True, is_hybrid=True)
    assert cfg._is_default_v2_model_runner_model() is False


def test_no_model_config_is_not_v2():
    assert VllmConfig()._is_default_v2_model_runner_model() is False


@pytest.mark.parametrize("value,expected", [("0", False), ("1", True)])
def test_v2_model_runner_env_tri_state(monkeypatch, value, expected):
    import vllm.config.vllm as vllm_mod

    monkeypatch.setattr(vllm_mod, "_v2_model_runner_built", lambda: True)
    cfg = VllmConfig()
    cfg.model_config = _model("MixtralForCausalLM", is_moe=True)  # default would be V1
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)
    assert cfg.use_v2_model_runner is expected
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    assert cfg.use_v2_model_runner is False  # unset: back to the default rule


# Upstream's rule (0.28 and 0.33): async + V2 -> pp + 1; async + V1 -> 2 if
# pp <= 1 else pp; not async -> pp. (V1 + async + pp > 1 is refused when the
# config is built: tests/v1/worker/test_gpu_model_runner_async.py.)
@pytest.mark.parametrize(
    "async_sched,use_v2,pp,expected",
    [
        (False, False, 1, 1),
        (False, True, 1, 1),
        (False, True, 2, 2),
        (True, False, 1, 2),
        (True, False, 2, 2),
        (True, False, 3, 3),
        (True, True, 1, 2),
        (True, True, 2, 3),
        (True, True, 3, 4),
    ],
)
def test_max_concurrent_batches(monkeypatch, async_sched, use_v2, pp, expected):
    cfg = VllmConfig(
        parallel_config=ParallelConfig(
            pipeline_parallel_size=pp, distributed_executor_backend="mp"
        ),
        scheduler_config=SchedulerConfig(),
    )
    cfg.scheduler_config.async_scheduling = async_sched
    monkeypatch.setattr(VllmConfig, "use_v2_model_runner", property(lambda self: use_v2))
    assert cfg.max_concurrent_batches == expected


def test_register_stateful_layer_needs_a_unique_prefix():
    from vllm.config import CompilationConfig

    cc = CompilationConfig()
    layer = object()
    cc.register_stateful_layer("model.layers.0.mixer", layer, "Mamba")
    assert cc.static_forward_context["model.layers.0.mixer"] is layer
    with pytest.raises(ValueError, match="Mamba layers need a unique, non-empty prefix"):
        cc.register_stateful_layer("model.layers.0.mixer", object(), "Mamba")
    with pytest.raises(ValueError, match="GDN layers need a unique, non-empty prefix"):
        cc.register_stateful_layer("", object(), "GDN")


@pytest.mark.parametrize(
    ("given", "expected"), [(-1, 512), (None, 512), (256, 256), ("0.25K", 256)]
)
def test_model_config_max_model_len_is_an_int(tiny_model_dir, given, expected):
    """-1 (the default) and None derive the length from the checkpoint
    (max_position_embeddings=512 here); "1k"-style strings are parsed, as by
    upstream's validator. Whatever was given, the field holds an int."""
    from vllm.config import ModelConfig

    mc = ModelConfig(model=tiny_model_dir("llama"), max_model_len=given)
    assert mc.max_model_len == expected and type(mc.max_model_len) is int
    assert ModelConfig(model=tiny_model_dir("llama")).max_model_len == 512
