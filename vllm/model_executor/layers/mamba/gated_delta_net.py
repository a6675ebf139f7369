"""Gated DeltaNet linear attention (upstream: `Qwen3NextGatedDeltaNet` in
vllm/model_executor/models/qwen3_next.py), in PyTorch, all requests of a step
batched: one recurrent step for decodes, the chunked (WY) form for prefills
(ops in vllm/model_executor/layers/fla/ops/).

Per request and layer the state is (conv_state [C, K - 1], recurrent state
S [Hv, Dk, Dv]), C = 2 * Hk * Dk + Hv * Dv (the conv runs over q, k, v
together), kept in the request's slot of a Mamba-type KV cache group.

For each token, per value head h (q, k L2-normalised, q / sqrt(Dk); query and
key heads are shared by Hv / Hk consecutive value heads):
    S = exp(g_t) * S                                  g_t = -exp(A_log) softplus(a_t + dt_bias)
    S = S + k_t (beta_t (v_t - S^T k_t))^T            beta_t = sigmoid(b_t)  (the delta rule)
    o_t = S^T q_t
then o is RMS-normalised per head, gated by silu(z), and projected out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.fla.ops import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
)
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
    causal_conv1d_fn,
    causal_conv1d_update,
)
from vllm.model_executor.layers.mamba.ops.varlen import StateGroup, build_state_groups
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend
from vllm.v1.kv_cache_interface import MambaSpec, get_max_model_len

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class RMSNormGated(nn.Module):
    """weight * x / rms(x), times silu(gate), statistics in float32."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * xf.to(x.dtype)
        return (out * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_k_heads: int,
        num_v_heads: int,
        head_k_dim: int,
        head_v_dim: int,
        conv_kernel_size: int,
        rms_norm_eps: float,
        prefix: str = "",
    ) -> None:
        super().__init__()
        vllm_config = get_current_vllm_config()
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise NotImplementedError("Gated DeltaNet with tensor parallelism is not built.")
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size = conv_kernel_size
        self.in_proj_qkv = ReplicatedLinear(
            hidden_size, self.conv_dim, bias=False, prefix=f"{prefix}.in_proj_qkv"
        )
        self.in_proj_z = ReplicatedLinear(
            hidden_size, self.value_dim, bias=False, prefix=f"{prefix}.in_proj_z"
        )
        self.in_proj_b = ReplicatedLinear(
            hidden_size, num_v_heads, bias=False, prefix=f"{prefix}.in_proj_b"
        )
        self.in_proj_a = ReplicatedLinear(
            hidden_size, num_v_heads, bias=False, prefix=f"{prefix}.in_proj_a"
        )
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, conv_kernel_size, groups=self.conv_dim, bias=False
        )
        self.conv1d.requires_grad_(False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(num_v_heads), requires_grad=False)
        self.norm = RMSNormGated(head_v_dim, eps=rms_norm_eps)
        self.out_proj = ReplicatedLinear(
            self.value_dim, hidden_size, bias=False, prefix=f"{prefix}.out_proj"
        )
        self.layer_name = prefix
        self.dtype = torch.get_default_dtype()
        vllm_config.compilation_config.register_stateful_layer(prefix, self, "GDN")
        self.kv_cache: list = [()]  # bound by the runner: (conv_states, recurrent_states)

    def get_attn_backend(self) -> type[GDNAttentionBackend]:
        return GDNAttentionBackend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> MambaSpec:
        return MambaSpec(
            block_size=get_max_model_len(vllm_config),
            shapes=(
                (self.conv_dim, self.conv_kernel_size - 1),
                (self.num_v_heads, self.head_k_dim, self.head_v_dim),
            ),
            dtypes=(self.dtype, self.dtype),
            mamba_type="gdn_attention",
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H] -> [T, H]; all requests batched, each from its
        slot's state: decodes in one recurrent step, prefills in the chunked form."""
        ctx = get_forward_context()
        md = ctx.attn_metadata[self.layer_name] if ctx.attn_metadata else None
        mixed, _ = self.in_proj_qkv(hidden_states)  # [T, C]
        z, _ = self.in_proj_z(hidden_states)
        b, _ = self.in_proj_b(hidden_states)
        a, _ = self.in_proj_a(hidden_states)
        beta = b.float().sigmoid()  # [T, Hv]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        if md is None:  # dummy / profiling run: one stateless sequence
            groups = build_state_groups([0, mixed.shape[0]], mixed.device)
            states = None
        else:
            groups, states = md.state_groups, self.kv_cache[ctx.virtual_engine]
        # Tokens past the scheduled ones (padding) stay 0.
        out = torch.zeros(
            hidden_states.shape[0],
            self.num_v_heads,
            self.head_v_dim,
            dtype=hidden_states.dtype,
            device=hidden_states.device,
        )
        for group in groups:
            out[group.flat_index] = self._run_group(mixed, beta, g, group, states)
        out = self.norm(out, z.view_as(out)).reshape(hidden_states.shape[0], -1)
        result, _ = self.out_proj(out)
        return result

    def _run_group(
        self,
        mixed: torch.Tensor,
        beta: torch.Tensor,
        g: torch.Tensor,
        group: StateGroup,
        states: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """One group: mixed [T, C], beta/g [T, Hv] (the whole step) ->
        [n, Hv, Dv] for group.flat_index; the group's state slots are updated."""
        gn, length = group.token_index.shape
        xg = mixed[group.token_index]  # [G, L, C]
        if states is not None:
            conv_in = group.gather_states(states[0], mixed.dtype)
            s0 = group.gather_states(states[1], torch.float32)
        else:
            conv_in = mixed.new_zeros(gn, self.conv_dim, self.conv_kernel_size - 1)
            s0 = None
        if length == 1:
            x, conv_out = causal_conv1d_update(xg[:, 0], conv_in, self.conv1d.weight, None)
            x = x[:, None]
        else:
            x, conv_out = causal_conv1d_fn(xg, self.conv1d.weight, None, conv_in, group.lengths)
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.num_v_heads // self.num_k_heads
        q = q.reshape(gn, length, self.num_k_heads, -1).repeat_interleave(rep, dim=2).float()
        k = k.reshape(gn, length, self.num_k_heads, -1).repeat_interleave(rep, dim=2).float()
        v = v.reshape(gn, length, self.num_v_heads, -1)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        # beta = g = 0 on padding: the state passes it unchanged.
        mask = group.mask[..., None]
        bg, gg = beta[group.token_index] * mask, g[group.token_index] * mask
        rule = fused_recurrent_gated_delta_rule if length == 1 else chunk_gated_delta_rule
        o, state = rule(q, k, v, gg, bg, s0, scale=self.head_k_dim**-0.5)
        if states is not None:
            group.scatter_states(states[0], conv_out)
            group.scatter_states(states[1], state)
        return o[group.mask].to(mixed.dtype)
