"""Every built RoPE scaling type against transformers' own computation: the
cos/sin table equals cos/sin(t * inv_freq) * attention_factor with transformers'
`ROPE_INIT_FUNCTIONS[type]` (float32 tolerance), read through the same config
path the models use (`get_rope_parameters`); plus the model-level pieces
(DeepSeek softmax scale, max_model_len derivation)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV2Config, LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from vllm.model_executor.layers.rotary_embedding import (
    DeepseekScalingRotaryEmbedding,
    DynamicNTKScalingRotaryEmbedding,
    LinearScalingRotaryEmbedding,
    Llama3RotaryEmbedding,
    Phi3LongRoPEScaledRotaryEmbedding,
    YaRNScalingRotaryEmbedding,
    get_rope,
    get_rope_parameters,
)

HEAD = 32
BASE = 5000.0
MAX_POS = 128


def _llama_cfg(rope: dict, **kw) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEAD * 4,
        num_attention_heads=4,
        head_dim=HEAD,
        max_position_embeddings=MAX_POS,
        rope_parameters={"rope_theta": BASE, **rope},
        **kw,
    )


def _hf_table(cfg, rope_type: str, num_positions: int, seq_len: int | None = None):
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu", seq_len=seq_len)
    t = torch.arange(num_positions, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq.float())
    return torch.cat((freqs.cos(), freqs.sin()), -1) * attention_factor


def _ours(cfg, rope_cls, head: int = HEAD, neox: bool = True):
    theta, scaling = get_rope_parameters(cfg)
    factor = getattr(cfg, "partial_rotary_factor", None) or cfg.rope_parameters.get(
        "partial_rotary_factor", 1.0
    )
    rope = get_rope(
        head,
        head,
        cfg.max_position_embeddings,
        theta,
        is_neox_style=neox,
        rope_scaling=scaling,
        dtype=torch.float32,
        partial_rotary_factor=factor,
    )
    assert type(rope) is rope_cls
    return rope


CASES = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, LinearScalingRotaryEmbedding, 4 * MAX_POS),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        Llama3RotaryEmbedding,
        MAX_POS,
    ),
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        YaRNScalingRotaryEmbedding,
        4 * 32,
    ),
    "yarn_betas_no_truncate": (
        {
            "rope_type": "yarn",
            "factor": 3.0,
            "original_max_position_embeddings": 40,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
        },
        YaRNScalingRotaryEmbedding,
        3 * 40,
    ),
    "yarn_attention_factor": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "attention_factor": 0.8,
        },
        YaRNScalingRotaryEmbedding,
        4 * 32,
    ),
    "yarn_mscale_all_dim": (  # DeepSeek-V3 style keys under the plain "yarn" type
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4,
            "mscale": 1.0,
            "mscale_all_dim": 0.8,
        },
        DeepseekScalingRotaryEmbedding,
        160,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_cos_sin_cache_matches_transformers(case, partial):
    rope, cls, num_positions = CASES[case]
    cfg = _llama_cfg(dict(rope), partial_rotary_factor=partial)
    ours = _ours(cfg, cls)
    assert ours.rotary_dim == int(HEAD * partial)
    assert ours.cos_sin_cache.shape == (num_positions, ours.rotary_dim)
    ref = _hf_table(cfg, rope["rope_type"], num_positions)
    torch.testing.assert_close(ours.cos_sin_cache, ref, atol=1e-5, rtol=1e-5)


def test_dynamic_ntk_is_transformers_at_the_full_length():
    """The fixed table is transformers' dynamic frequencies at seq_len = max * factor
    (its state after growing to the full length); at the original length
    transformers keeps the plain base, which a fixed table cannot follow."""
    cfg = _llama_cfg({"rope_type": "dynamic", "factor": 2.0})
    ours = _ours(cfg, DynamicNTKScalingRotaryEmbedding)
    assert ours.cos_sin_cache.shape[0] == 2 * MAX_POS
    ref = _hf_table(cfg, "dynamic", 2 * MAX_POS, seq_len=2 * MAX_POS)
    torch.testing.assert_close(ours.cos_sin_cache, ref, atol=1e-5, rtol=1e-5)
    short = _hf_table(cfg, "dynamic", 2 * MAX_POS, seq_len=MAX_POS)
    assert not torch.allclose(ours.cos_sin_cache, short, atol=1e-3)


def _phi3_cfg(max_pos: int, original: int) -> Phi3Config:
    gen = torch.Generator().manual_seed(0)
    half = 8  # head 32 * partial 0.5 / 2
    return Phi3Config(
        hidden_size=HEAD * 4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max_pos,
        original_max_position_embeddings=original,
        partial_rotary_factor=0.5,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": BASE,
            "short_factor": (1 + torch.rand(half, generator=gen)).tolist(),
            "long_factor": (1 + 4 * torch.rand(half, generator=gen)).tolist(),
        },
    )


@pytest.mark.parametrize("long", [True, False])
def test_longrope_matches_transformers_short_and_long(long, monkeypatch):
    """Long factors when the engine's max_model_len exceeds the original length
    (transformers' choice for any sequence longer than it), short otherwise."""
    from vllm.model_executor.layers import rotary_embedding as pkg
    from vllm.model_executor.layers.rotary_embedding import phi3_long_rope_scaled_rope as mod

    cfg = _phi3_cfg(MAX_POS, 32)
    for module in (pkg, mod):  # the class and get_rope's sharing key both read it
        monkeypatch.setattr(module, "_engine_max_model_len", lambda: MAX_POS if long else 32)
    ours = _ours(cfg, Phi3LongRoPEScaledRotaryEmbedding)
    assert ours.use_long_rope is long and ours.rotary_dim == 16
    seq_len = 33 if long else 32  # transformers picks long iff seq_len > original
    ref = _hf_table(cfg, "longrope", MAX_POS, seq_len=seq_len)
    torch.testing.assert_close(ours.cos_sin_cache, ref, atol=1e-5, rtol=1e-5)
    expected_mscale = math.sqrt(1 + math.log(MAX_POS / 32) / math.log(32))
    assert ours.long_mscale == pytest.approx(expected_mscale)


def test_longrope_factor_count_is_checked():
    with pytest.raises(ValueError, match="short_factor has 3 values"):
        Phi3LongRoPEScaledRotaryEmbedding(
            32, 32, 64, 16, BASE, True, torch.float32, [1.0] * 3, [1.0] * 16
        )


def test_deepseek_yarn_matches_transformers_rotary_and_softmax_scale():
    """DeepSeek-V2's rotary (interleaved, yarn with mscale / mscale_all_dim) and its
    attention softmax scale, against transformers' DeepseekV2 classes."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf

    rope = {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 16,
        "mscale": 0.9,
        "mscale_all_dim": 0.7,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    cfg = DeepseekV2Config(
        hidden_size=64,
        num_attention_heads=4,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=16,
        kv_lora_rank=32,
        max_position_embeddings=128,
        rope_parameters={"rope_theta": BASE, **rope},
    )
    theta, scaling = get_rope_parameters(cfg)
    ours = get_rope(
        16, 16, 128, theta, False, {**scaling, "rope_type": "deepseek_yarn"}, torch.float32
    )
    assert type(ours) is DeepseekScalingRotaryEmbedding
    hf_rope = hf.DeepseekV2RotaryEmbedding(cfg)
    positions = torch.arange(128)
    freqs_cis = hf_rope(torch.zeros(1), positions[None])[0]  # complex [T, 8]
    ref = torch.cat((freqs_cis.real, freqs_cis.imag), -1)
    torch.testing.assert_close(ours.cos_sin_cache, ref, atol=1e-5, rtol=1e-5)

    from vllm.model_executor.models.deepseek_v2 import deepseek_softmax_scale

    expected = hf.yarn_apply_mscale(cfg.rope_parameters, 32**-0.5)
    assert expected != pytest.approx(32**-0.5)
    assert deepseek_softmax_scale(32, scaling) == pytest.approx(expected)
    assert deepseek_softmax_scale(32, None) == pytest.approx(32**-0.5)


def test_rope_theta_and_partial_from_old_style_config():
    """Old-style `rope_scaling` + top-level `rope_theta` (transformers converts)."""
    cfg = LlamaConfig(
        hidden_size=128,
        num_attention_heads=4,
        rope_theta=123.0,
        rope_scaling={"type": "linear", "factor": 2.0},
    )
    theta, scaling = get_rope_parameters(cfg)
    assert theta == 123.0 and scaling is not None and scaling["factor"] == 2.0
    rope = get_rope(32, 32, 64, theta, rope_scaling=scaling, dtype=torch.float32)
    assert type(rope) is LinearScalingRotaryEmbedding and rope.base == 123.0


@pytest.mark.parametrize(
    "scaling,match",
    [
        ({"rope_type": "dynamic", "alpha": 2.0}, "alpha"),
        ({"rope_type": "linear"}, "needs `factor`"),
        ({"rope_type": "longrope", "original_max_position_embeddings": 8}, "short_factor"),
        ({"rope_type": "linear", "factor": [2.0, 4.0]}, "list of factors"),
    ],
)
def test_bad_scaling_is_refused_by_name(scaling, match):
    with pytest.raises(ValueError, match=match):
        get_rope(32, 32, 64, BASE, rope_scaling=scaling, dtype=torch.float32)


@pytest.mark.parametrize("bad", [0.0, 1.5])
def test_partial_rotary_factor_range(bad):
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        get_rope(32, 32, 64, BASE, dtype=torch.float32, partial_rotary_factor=bad)
