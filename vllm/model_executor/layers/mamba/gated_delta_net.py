"""Gated DeltaNet linear attention (upstream: `Qwen3NextGatedDeltaNet` in
vllm/model_executor/models/qwen3_next.py), in PyTorch, token by token.

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
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend
from vllm.v1.kv_cache_interface import MambaSpec

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
    def __init__(self, hidden_size: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
                 head_v_dim: int, conv_kernel_size: int, rms_norm_eps: float,
                 prefix: str = "") -> None:
        super().__init__()
        vllm_config = get_current_vllm_config()
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise NotImplementedError("Gated DeltaNet with tensor parallelism is not built.")
        self.num_k_heads, self.num_v_heads = num_k_heads, num_v_heads
        self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
        self.key_dim, self.value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size = conv_kernel_size
        self.in_proj_qkv = ReplicatedLinear(hidden_size, self.conv_dim, bias=False,
                                            prefix=f"{prefix}.in_proj_qkv")
        self.in_proj_z = ReplicatedLinear(hidden_size, self.value_dim, bias=False,
                                          prefix=f"{prefix}.in_proj_z")
        self.in_proj_b = ReplicatedLinear(hidden_size, num_v_heads, bias=False,
                                          prefix=f"{prefix}.in_proj_b")
        self.in_proj_a = ReplicatedLinear(hidden_size, num_v_heads, bias=False,
                                          prefix=f"{prefix}.in_proj_a")
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, conv_kernel_size,
                                groups=self.conv_dim, bias=False)
        self.conv1d.requires_grad_(False)
        self.dt_bias = nn.Parameter(torch.ones(num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(num_v_heads), requires_grad=False)
        self.norm = RMSNormGated(head_v_dim, eps=rms_norm_eps)
        self.out_proj = ReplicatedLinear(self.value_dim, hidden_size, bias=False,
                                         prefix=f"{prefix}.out_proj")
        self.layer_name = prefix
        self.dtype = torch.get_default_dtype()
        static_ctx = vllm_config.compilation_config.static_forward_context
        if not prefix or prefix in static_ctx:
            raise ValueError(f"GDN layers need a unique, non-empty prefix (got {prefix!r}).")
        static_ctx[prefix] = self
        self.kv_cache: list = [()]  # bound by the runner: (conv_states, recurrent_states)

    def get_attn_backend(self) -> type[GDNAttentionBackend]:
        return GDNAttentionBackend

    def get_kv_cache_spec(self, vllm_config: "VllmConfig") -> MambaSpec:
        return MambaSpec(block_size=vllm_config.model_config.max_model_len,
                         shapes=((self.conv_dim, self.conv_kernel_size - 1),
                                 (self.num_v_heads, self.head_k_dim, self.head_v_dim)),
                         dtypes=(self.dtype, self.dtype), mamba_type="gdn_attention")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H] -> [T, H], request by request from its slot's state."""
        ctx = get_forward_context()
        md = ctx.attn_metadata[self.layer_name] if ctx.attn_metadata else None
        mixed, _ = self.in_proj_qkv(hidden_states)  # [T, C]
        z, _ = self.in_proj_z(hidden_states)
        b, _ = self.in_proj_b(hidden_states)
        a, _ = self.in_proj_a(hidden_states)
        beta = b.float().sigmoid()  # [T, Hv]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        out = torch.zeros(hidden_states.shape[0], self.num_v_heads, self.head_v_dim,
                          dtype=hidden_states.dtype, device=hidden_states.device)
        if md is None:  # dummy / profiling run: one stateless sequence
            out = self._run(mixed, beta, g, None, None)
        else:
            conv_states, rec_states = self.kv_cache[ctx.virtual_engine]
            qsl = md.query_start_loc
            for i in range(md.num_reqs):
                slot, s, e = md.state_indices[i], qsl[i], qsl[i + 1]
                if not md.has_initial_states[i]:
                    conv_states[slot].zero_()
                    rec_states[slot].zero_()
                out[s:e] = self._run(mixed[s:e], beta[s:e], g[s:e], conv_states[slot],
                                     rec_states[slot])
        out = self.norm(out, z.view_as(out)).reshape(hidden_states.shape[0], -1)
        result, _ = self.out_proj(out)
        return result

    def _run(self, mixed: torch.Tensor, beta: torch.Tensor, g: torch.Tensor,
             conv_state: torch.Tensor | None, rec_state: torch.Tensor | None) -> torch.Tensor:
        """One chunk of one request: mixed [L, C], beta/g [L, Hv] -> [L, Hv, Dv];
        the states are updated in place."""
        length = mixed.shape[0]
        x = self._conv(mixed, conv_state)
        q, k, v = x.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.num_v_heads // self.num_k_heads
        q = q.reshape(length, self.num_k_heads, -1).repeat_interleave(rep, dim=1).float()
        k = k.reshape(length, self.num_k_heads, -1).repeat_interleave(rep, dim=1).float()
        v = v.reshape(length, self.num_v_heads, -1).float()
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) / self.head_k_dim**0.5
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        state = (rec_state.float() if rec_state is not None else
                 mixed.new_zeros(self.num_v_heads, self.head_k_dim, self.head_v_dim,
                                 dtype=torch.float32))
        decay = g.exp()  # [L, Hv]
        outs = []
        for t in range(length):
            state = state * decay[t][:, None, None]
            kv_mem = torch.einsum("hkv,hk->hv", state, k[t])
            delta = (v[t] - kv_mem) * beta[t][:, None]
            state = state + k[t][:, :, None] * delta[:, None, :]
            outs.append(torch.einsum("hkv,hk->hv", state, q[t]))
        if rec_state is not None:
            rec_state.copy_(state)
        return torch.stack(outs).to(mixed.dtype)

    def _conv(self, x: torch.Tensor, conv_state: torch.Tensor | None) -> torch.Tensor:
        """Causal depthwise conv over [previous K-1 inputs; x], then SiLU."""
        k = self.conv_kernel_size
        prev = (conv_state.t() if conv_state is not None
                else x.new_zeros(k - 1, self.conv_dim))
        seq = torch.cat((prev.to(x.dtype), x), dim=0)
        if conv_state is not None:
            conv_state.copy_(seq[-(k - 1):].t())
        out = F.conv1d(seq.t().unsqueeze(0), self.conv1d.weight, None, groups=self.conv_dim)
        return F.silu(out[0].t())
