"""Mamba-1 and Gated DeltaNet layers over engine-like steps: requests of
different lengths batched in one forward (decodes and prefills mixed), a
prefill continued in a later step from the cached state, a fresh request in
a dirty slot, and padded tail tokens. Every request's outputs equal a
token-by-token reference run of the layer's math over its whole sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.fla.ops import recurrent_gated_delta_rule_ref
from vllm.model_executor.layers.mamba.gated_delta_net import GatedDeltaNet
from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_scan_ref
from vllm.model_executor.layers.mamba.ops.varlen import build_state_groups
from vllm.v1.attention.backends.mamba1_attn import Mamba1AttentionMetadata

HIDDEN, SLOTS = 16, 6
# Per step: (request, tokens, slot). Request "b" prefills, then continues with
# 6 tokens while "a" and "c" decode; "d" starts in slot 2, left dirty by the test.
STEPS = [
    [("a", 5, 3), ("b", 1, 0), ("c", 12, 1)],
    [("a", 1, 3), ("b", 6, 0), ("c", 1, 1), ("d", 3, 2)],
    [("d", 1, 2), ("b", 1, 0)],
]
PAD_TOKENS = 2  # rows past the scheduled tokens, as a padded batch would have


def _causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One whole sequence from zeros: x [L, C] -> silu(conv) [L, C]."""
    k = weight.shape[-1]
    padded = torch.cat((x.new_zeros(k - 1, x.shape[1]), x)).t()[None]
    return F.silu(F.conv1d(padded, weight.view(x.shape[1], 1, k), bias, groups=x.shape[1])[0].t())


def _mamba_ref(m: MambaMixer, h: torch.Tensor) -> torch.Tensor:
    x, z = m.in_proj(h)[0].chunk(2, dim=-1)
    u = _causal_conv(x, m.conv1d.weight, m.conv1d.bias)
    dt, b, c = m.x_proj(u)[0].split([m.time_step_rank, m.d_state, m.d_state], dim=-1)
    dt = F.softplus(m.dt_proj(dt)[0])
    y, _ = selective_scan_ref(u, dt, -torch.exp(m.A_log), b, c, m.D, z)
    return m.out_proj(y)[0]


def _gdn_ref(m: GatedDeltaNet, h: torch.Tensor) -> torch.Tensor:
    n = h.shape[0]
    x = _causal_conv(m.in_proj_qkv(h)[0], m.conv1d.weight, None)
    q, k, v = x.split([m.key_dim, m.key_dim, m.value_dim], dim=-1)
    rep = m.num_v_heads // m.num_k_heads
    q, k = (
        F.normalize(t.reshape(n, m.num_k_heads, -1), dim=-1, eps=1e-3).repeat_interleave(rep, dim=1)
        for t in (q, k)
    )
    g = -m.A_log.exp() * F.softplus(m.in_proj_a(h)[0] + m.dt_bias)
    o, _ = recurrent_gated_delta_rule_ref(
        q, k, v.reshape(n, m.num_v_heads, -1), g, m.in_proj_b(h)[0].sigmoid()
    )
    z = m.in_proj_z(h)[0].view_as(o)
    return m.out_proj(m.norm(o, z).reshape(n, -1))[0]


def _build(kind: str) -> torch.nn.Module:
    if kind == "mamba":
        layer = MambaMixer(
            HIDDEN,
            ssm_state_size=4,
            conv_kernel_size=4,
            intermediate_size=24,
            time_step_rank=4,
            use_conv_bias=True,
            use_bias=False,
            prefix="m",
        )
    else:
        layer = GatedDeltaNet(
            HIDDEN,
            num_k_heads=2,
            num_v_heads=4,
            head_k_dim=8,
            head_v_dim=6,
            conv_kernel_size=4,
            rms_norm_eps=1e-6,
            prefix="m",
        )
    gen = torch.Generator().manual_seed(0)
    for p in layer.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    k = layer.conv_kernel_size
    shapes = (
        [(layer.d_inner, k - 1), (layer.d_inner, layer.d_state)]
        if kind == "mamba"
        else [(layer.conv_dim, k - 1), (layer.num_v_heads, layer.head_k_dim, layer.head_v_dim)]
    )
    layer.kv_cache = [tuple(torch.zeros(SLOTS, *shape) for shape in shapes)]
    return layer


@pytest.mark.parametrize("kind", ["mamba", "gdn"])
def test_batched_steps_match_token_by_token_reference(kind):
    config = VllmConfig()
    with set_current_vllm_config(config):
        layer = _build(kind)
    for state in layer.kv_cache[0]:
        state[2].fill_(7.0)  # slot 2 is dirty: "d" must start from zeros
    gen = torch.Generator().manual_seed(1)
    inputs: dict[str, list[torch.Tensor]] = {}
    outputs: dict[str, list[torch.Tensor]] = {}
    for step in STEPS:
        hs = [torch.randn(n, HIDDEN, generator=gen) for _, n, _ in step]
        qsl = [0]
        for h in hs:
            qsl.append(qsl[-1] + h.shape[0])
        slots = [slot for _, _, slot in step]
        has_init = [name in inputs for name, _, _ in step]
        md = Mamba1AttentionMetadata(
            num_reqs=len(step),
            num_actual_tokens=qsl[-1],
            query_start_loc=qsl,
            state_indices=slots,
            has_initial_states=has_init,
            state_groups=build_state_groups(qsl, torch.device("cpu"), slots, has_init),
        )
        batch = torch.cat(hs + [torch.randn(PAD_TOKENS, HIDDEN, generator=gen)])
        with set_forward_context({"m": md}, config), torch.no_grad():
            out = layer(batch)
        assert torch.count_nonzero(out[qsl[-1] :]) == 0  # padded rows stay zero
        for (name, _, _), h, s, e in zip(step, hs, qsl, qsl[1:]):
            inputs.setdefault(name, []).append(h)
            outputs.setdefault(name, []).append(out[s:e])
    ref = _mamba_ref if kind == "mamba" else _gdn_ref
    with torch.no_grad():
        for name in inputs:
            expected = ref(layer, torch.cat(inputs[name]))
            torch.testing.assert_close(torch.cat(outputs[name]), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["mamba", "gdn"])
def test_dummy_run_is_one_stateless_sequence(kind):
    config = VllmConfig()
    with set_current_vllm_config(config):
        layer = _build(kind)
    h = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(2))
    with set_forward_context(None, config), torch.no_grad():
        out = layer(h)
    ref = _mamba_ref if kind == "mamba" else _gdn_ref
    with torch.no_grad():
        torch.testing.assert_close(out, ref(layer, h), atol=1e-4, rtol=1e-4)
    assert all(torch.count_nonzero(s) == 0 for s in layer.kv_cache[0])
