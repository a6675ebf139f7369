"""Layer-level contracts: weight loaders, norms, rotary, vocab padding, packed GEMMs,
the Attention layer's registration and the forward context."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import get_forward_context, set_forward_context
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope, get_rope_parameters
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.selector import get_attn_backend
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec


@pytest.fixture
def vllm_config():
    config = VllmConfig(cache_config=CacheConfig(block_size=16))
    with set_current_vllm_config(config):
        yield config


def test_qkv_and_merged_loaders_place_shards(vllm_config):
    torch.manual_seed(0)
    hidden, head, heads, kv_heads = 32, 8, 4, 2
    qkv = QKVParallelLinear(hidden, head, heads, kv_heads, bias=True)
    parts = {
        "q": torch.randn(heads * head, hidden),
        "k": torch.randn(kv_heads * head, hidden),
        "v": torch.randn(kv_heads * head, hidden),
    }
    biases = {s: torch.randn(w.shape[0]) for s, w in parts.items()}
    for shard in ("v", "q", "k"):  # any order
        qkv.weight.weight_loader(qkv.weight, parts[shard], shard)
        qkv.bias.weight_loader(qkv.bias, biases[shard], shard)
    x = torch.randn(5, hidden)
    out, extra_bias = qkv(x)
    expected = torch.cat([F.linear(x, parts[s], biases[s]) for s in ("q", "k", "v")], -1)
    torch.testing.assert_close(out, expected)
    assert extra_bias is None

    merged = MergedColumnParallelLinear(hidden, [24, 24], bias=False)
    gate, up = torch.randn(24, hidden), torch.randn(24, hidden)
    merged.weight.weight_loader(merged.weight, up, 1)
    merged.weight.weight_loader(merged.weight, gate, 0)
    gate_up, _ = merged(x)
    torch.testing.assert_close(SiluAndMul()(gate_up), F.silu(x @ gate.T) * (x @ up.T))
    with pytest.raises(ValueError):
        merged.weight.weight_loader(merged.weight, gate, 2)


def test_row_and_replicated_loaders_check_shapes(vllm_config):
    row = RowParallelLinear(16, 8, bias=True, skip_bias_add=True)
    w, b = torch.randn(8, 16), torch.randn(8)
    row.weight.weight_loader(row.weight, w)
    row.bias.weight_loader(row.bias, b)
    x = torch.randn(3, 16)
    out, bias = row(x)
    torch.testing.assert_close(out, x @ w.T)  # bias left to the caller
    assert bias is row.bias
    rep = ReplicatedLinear(16, 8, bias=False)
    with pytest.raises(ValueError):
        rep.weight.weight_loader(rep.weight, torch.randn(8, 15))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_cpu_gemm_matches_dense(vllm_config, dtype):
    torch.manual_seed(0)
    layer = ReplicatedLinear(64, 96, bias=True, params_dtype=dtype)
    layer.weight.data.copy_(torch.randn(96, 64))
    layer.bias.data.copy_(torch.randn(96))
    x = torch.randn(7, 64, dtype=dtype)
    dense, _ = layer(x)
    layer.process_weights_after_loading(dtype)
    packed, _ = layer(x)
    torch.testing.assert_close(packed, dense, atol=1e-4, rtol=1e-4)


def _packed_layer(
    monkeypatch, gemm: str, out_features: int = 96, dtype: torch.dtype = torch.float32
) -> ReplicatedLinear:
    monkeypatch.setenv("VLLM_CPU_GEMM", gemm)
    torch.manual_seed(0)
    layer = ReplicatedLinear(64, out_features, bias=True, params_dtype=dtype)
    layer.weight.data.copy_(torch.randn(out_features, 64))
    layer.bias.data.copy_(torch.randn(out_features))
    layer.process_weights_after_loading(dtype)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_gemm_choice(vllm_config, monkeypatch, dtype):
    """Panels where the ops run their AVX2 build (auto) or when asked
    (panel), oneDNN (or dense, where oneDNN lacks the dtype) otherwise; a
    panel layout needs whole panels of 16 outputs; the paths give the same
    products (bf16: to an ulp of the output)."""
    from vllm import _custom_ops as ops

    def panels(layer: ReplicatedLinear) -> bool:  # else oneDNN's layout or the dense weight
        return getattr(layer._packed_weight, "layout", None) == torch.strided

    if not ops.panel_gemm_available():
        pytest.skip("compiled CPU ops with panel_gemm not loaded")
    x = torch.randn(3, 64).to(dtype)
    assert panels(_packed_layer(monkeypatch, "auto", dtype=dtype)) == (ops.cpu_ops_isa() == "avx2")
    panel = _packed_layer(monkeypatch, "panel", dtype=dtype)
    assert panel._packed_weight.shape == (6, 64, 16) and panel.weight.numel() == 0
    onednn = _packed_layer(monkeypatch, "onednn", dtype=dtype)
    assert not panels(onednn)
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(panel(x)[0], onednn(x)[0], atol=tol, rtol=tol)
    # 40 outputs: not whole panels, so not panels even when they are asked for.
    assert not panels(_packed_layer(monkeypatch, "panel", 40, dtype))


def test_cpu_gemm_choice_refused(vllm_config, monkeypatch):
    from vllm import _custom_ops as ops

    with pytest.raises(ValueError, match="VLLM_CPU_GEMM='fast'"):
        _packed_layer(monkeypatch, "fast")
    # Panels asked for without the compiled op: refused, naming the variable.
    monkeypatch.setattr(ops, "panel_gemm_available", lambda: False)
    with pytest.raises(ValueError, match="VLLM_CPU_GEMM=panel"):
        _packed_layer(monkeypatch, "panel")


def test_rms_norm_fused_residual_semantics():
    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-5)
    norm.weight.data.normal_()
    x, residual = torch.randn(4, 32), torch.randn(4, 32)

    def ref(h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight

    torch.testing.assert_close(norm(x), ref(x))
    out, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(out, ref(x + residual))


def _complex_rope(x, positions, base, rotary_dim, interleaved):
    """Reference rotation with complex numbers. x [T, heads, head]."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2).double() / rotary_dim)
    angles = positions.double()[:, None] * inv_freq[None, :]  # [T, rotary_dim / 2]
    rot = x[..., :rotary_dim].double()
    if interleaved:
        pairs = torch.view_as_complex(rot.reshape(*rot.shape[:-1], -1, 2).contiguous())
    else:
        half = rotary_dim // 2
        pairs = torch.complex(rot[..., :half], rot[..., half:])
    turned = pairs * torch.polar(torch.ones_like(angles), angles)[:, None, :]
    if interleaved:
        out = torch.view_as_real(turned).flatten(-2)
    else:
        out = torch.cat([turned.real, turned.imag], -1)
    return torch.cat([out.float(), x[..., rotary_dim:]], -1)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotary_matches_complex_rotation(neox, rotary_dim):
    torch.manual_seed(0)
    rope = get_rope(16, rotary_dim, 64, 10000.0, is_neox_style=neox, dtype=torch.float32)
    assert (
        get_rope(16, rotary_dim, 64, 10000.0, is_neox_style=neox, dtype=torch.float32) is rope
    )  # shared between layers
    positions = torch.tensor([0, 3, 17, 63])
    q, k = torch.randn(4, 4 * 16), torch.randn(4, 2 * 16)
    q_rot, k_rot = rope(positions, q, k)
    assert q_rot.shape == q.shape and k_rot.shape == k.shape
    for x, y in ((q, q_rot), (k, k_rot)):
        ref = _complex_rope(x.view(4, -1, 16), positions, 10000.0, rotary_dim, not neox)
        torch.testing.assert_close(y.view(4, -1, 16), ref, atol=1e-5, rtol=1e-5)


def test_rope_parameters_and_unknown_scaling():
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
    )
    theta, scaling = get_rope_parameters(cfg)
    assert theta == 5e5 and scaling["rope_type"] == "llama3" and "rope_theta" not in scaling
    assert get_rope_parameters(LlamaConfig()) == (10000.0, None)
    with pytest.raises(ValueError, match="yarn.*original_max_position_embeddings"):
        get_rope(16, 16, 64, 10000.0, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="'mrope'.*built: default"):
        get_rope(16, 16, 64, 10000.0, rope_scaling={"rope_type": "mrope", "factor": 2.0})


def test_vocab_padding_and_logits_processor(vllm_config):
    torch.manual_seed(0)
    embed = VocabParallelEmbedding(100, 8)
    assert embed.weight.shape == (128, 8)  # padded to a multiple of 64
    table = torch.randn(100, 8)
    embed.weight.weight_loader(embed.weight, table)
    assert torch.count_nonzero(embed.weight[100:]) == 0
    torch.testing.assert_close(embed(torch.tensor([3, 99])), table[[3, 99]])
    head = ParallelLMHead(100, 8).tie_weights(embed)
    hidden = torch.randn(2, 8)
    logits = LogitsProcessor(100)(head, hidden)
    torch.testing.assert_close(logits, hidden @ table.T)
    capped = LogitsProcessor(100, soft_cap=2.0, scale=0.5)(head, hidden)
    torch.testing.assert_close(capped, torch.tanh(hidden @ table.T / 2.0) * 2.0 * 0.5)
    head.process_weights_after_loading(torch.float32)  # packed copy; table stays for embed
    torch.testing.assert_close(LogitsProcessor(100)(head, hidden), logits, atol=1e-5, rtol=1e-5)
    assert embed.weight.shape == (128, 8)


def test_attention_layer_registration_and_specs(vllm_config):
    attn = Attention(4, 16, 0.25, num_kv_heads=2, prefix="model.layers.0.self_attn.attn")
    windowed = Attention(
        4,
        16,
        0.25,
        num_kv_heads=2,
        per_layer_sliding_window=8,
        prefix="model.layers.1.self_attn.attn",
    )
    ctx = vllm_config.compilation_config.static_forward_context
    assert ctx["model.layers.0.self_attn.attn"] is attn
    assert attn.layer_name == "model.layers.0.self_attn.attn"
    assert attn.get_attn_backend() is CPUAttentionBackend
    spec = attn.get_kv_cache_spec(vllm_config)
    assert isinstance(spec, FullAttentionSpec)
    assert (spec.block_size, spec.num_kv_heads, spec.head_size) == (16, 2, 16)
    wspec = windowed.get_kv_cache_spec(vllm_config)
    assert isinstance(wspec, SlidingWindowSpec) and wspec.sliding_window == 8
    with pytest.raises(ValueError, match="Duplicate layer name"):
        Attention(4, 16, 0.25, prefix="model.layers.0.self_attn.attn")
    # No metadata (profile run): zeros of the output shape, cache untouched.
    q, kv = torch.randn(3, 64), torch.randn(3, 32)
    with set_forward_context(None, vllm_config):
        out = attn(q, kv, kv)
    assert out.shape == (3, 64) and torch.count_nonzero(out) == 0


def test_forward_context_lifetime(vllm_config):
    with pytest.raises(RuntimeError, match="not set"):
        get_forward_context()
    with set_forward_context({"a": 1}, vllm_config, num_tokens=4) as ctx:
        assert get_forward_context() is ctx and ctx.attn_metadata == {"a": 1}
        assert ctx.num_tokens == 4 and ctx.virtual_engine == 0
        with pytest.raises(RuntimeError, match="nested"), set_forward_context(None, vllm_config):
            pass
    with pytest.raises(RuntimeError):
        get_forward_context()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU platform")
def test_selector_and_platform(monkeypatch):
    from vllm.platforms import current_platform

    assert current_platform.is_cpu() and current_platform.device_type == "cpu"
    assert current_platform.get_device_total_memory() > 0
    assert get_attn_backend(64, torch.float32, "auto", 16) is CPUAttentionBackend
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "FLASH_ATTN")
    with pytest.raises(ValueError, match="FLASH_ATTN"):
        get_attn_backend(64, torch.float32, "auto", 16)
