"""The Mamba-1 mixer (upstream: vllm/model_executor/layers/mamba/mamba_mixer.py),
in PyTorch: causal depthwise conv + selective scan, one request at a time.

Per layer and request the state is (conv_state [D, K - 1]: the last K - 1
conv inputs; ssm_state [D, N]), D = intermediate size, K = conv kernel,
N = state size. Both live in the request's state slot of the Mamba KV cache
group (`self.kv_cache[0] = (conv_states [slots, D, K-1], ssm_states [slots, D, N])`).

For token t with input u_t (after conv + SiLU):
    dt_t = softplus(dt_proj(x_proj(u_t)[:R]))             [D]
    B_t, C_t = x_proj(u_t)[R:R+N], [R+N:]                 [N]
    h_t = exp(dt_t * A) * h_{t-1} + dt_t * B_t * u_t      [D, N], A = -exp(A_log)
    y_t = h_t C_t + D * u_t, gated by silu(z_t)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import (ColumnParallelLinear, ReplicatedLinear,
                                               RowParallelLinear)
from vllm.v1.attention.backends.mamba1_attn import Mamba1AttentionBackend
from vllm.v1.kv_cache_interface import MambaSpec

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class MambaMixer(nn.Module):
    def __init__(self, hidden_size: int, ssm_state_size: int, conv_kernel_size: int,
                 intermediate_size: int, time_step_rank: int, use_conv_bias: bool,
                 use_bias: bool, activation: str = "silu", prefix: str = "") -> None:
        super().__init__()
        if activation != "silu":
            raise ValueError(f"Mamba activation {activation!r} is not supported.")
        vllm_config = get_current_vllm_config()
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise NotImplementedError("Mamba with tensor parallelism is not built.")
        self.d_inner, self.d_state = intermediate_size, ssm_state_size
        self.conv_kernel_size, self.time_step_rank = conv_kernel_size, time_step_rank
        self.in_proj = ColumnParallelLinear(hidden_size, 2 * intermediate_size, bias=use_bias,
                                            prefix=f"{prefix}.in_proj")
        # Depthwise conv, stored like nn.Conv1d: [D, 1, K].
        self.conv1d = nn.Conv1d(intermediate_size, intermediate_size, conv_kernel_size,
                                groups=intermediate_size, bias=use_conv_bias)
        self.conv1d.requires_grad_(False)
        self.x_proj = ReplicatedLinear(intermediate_size, time_step_rank + 2 * ssm_state_size,
                                       bias=False, prefix=f"{prefix}.x_proj")
        self.dt_proj = ColumnParallelLinear(time_step_rank, intermediate_size, bias=True,
                                            prefix=f"{prefix}.dt_proj")
        self.A_log = nn.Parameter(torch.empty(intermediate_size, ssm_state_size),
                                  requires_grad=False)
        self.D = nn.Parameter(torch.empty(intermediate_size), requires_grad=False)
        self.out_proj = RowParallelLinear(intermediate_size, hidden_size, bias=use_bias,
                                          prefix=f"{prefix}.out_proj")
        self.layer_name = prefix
        self.dtype = torch.get_default_dtype()
        static_ctx = vllm_config.compilation_config.static_forward_context
        if not prefix or prefix in static_ctx:
            raise ValueError(f"Mamba layers need a unique, non-empty prefix (got {prefix!r}).")
        static_ctx[prefix] = self
        self.kv_cache: list = [()]  # bound by the runner: (conv_states, ssm_states)

    def get_attn_backend(self) -> type[Mamba1AttentionBackend]:
        return Mamba1AttentionBackend

    def get_kv_cache_spec(self, vllm_config: "VllmConfig") -> MambaSpec:
        return MambaSpec(block_size=vllm_config.model_config.max_model_len,
                         shapes=((self.d_inner, self.conv_kernel_size - 1),
                                 (self.d_inner, self.d_state)),
                         dtypes=(self.dtype, self.dtype))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H] -> [T, H]; each request's slice is scanned
        from its slot's state (or zeros) and the slot gets the final state."""
        ctx = get_forward_context()
        md = ctx.attn_metadata[self.layer_name] if ctx.attn_metadata else None
        xz, _ = self.in_proj(hidden_states)
        x, z = xz.chunk(2, dim=-1)  # [T, D] each
        y = torch.zeros_like(x)
        if md is None:  # dummy / profiling run: one stateless sequence
            y = self._run(x, z, None, None)
        else:
            conv_states, ssm_states = self.kv_cache[ctx.virtual_engine]
            qsl = md.query_start_loc
            for i in range(md.num_reqs):
                slot = md.state_indices[i]
                if not md.has_initial_states[i]:
                    conv_states[slot].zero_()
                    ssm_states[slot].zero_()
                s, e = qsl[i], qsl[i + 1]
                y[s:e] = self._run(x[s:e], z[s:e], conv_states[slot], ssm_states[slot])
        out, _ = self.out_proj(y)
        return out

    def _run(self, x: torch.Tensor, z: torch.Tensor, conv_state: torch.Tensor | None,
             ssm_state: torch.Tensor | None) -> torch.Tensor:
        """One sequence chunk: x, z [L, D]; states updated in place -> [L, D]."""
        u = self._conv(x, conv_state)  # [L, D]
        params, _ = self.x_proj(u)
        dt, b, c = params.split([self.time_step_rank, self.d_state, self.d_state], dim=-1)
        dt, _ = self.dt_proj(dt)
        dt = F.softplus(dt.float())  # [L, D]
        a = -torch.exp(self.A_log.float())  # [D, N]
        h = (ssm_state.float() if ssm_state is not None
             else u.new_zeros(self.d_inner, self.d_state, dtype=torch.float32))
        decay = torch.exp(dt[:, :, None] * a)  # [L, D, N]
        drive = dt[:, :, None] * b.float()[:, None, :] * u.float()[:, :, None]  # [L, D, N]
        ys = []
        for t in range(u.shape[0]):
            h = decay[t] * h + drive[t]
            ys.append(h @ c[t].float())  # [D]
        if ssm_state is not None:
            ssm_state.copy_(h)
        y = torch.stack(ys) + u.float() * self.D.float()
        return (y * F.silu(z.float())).to(x.dtype)

    def _conv(self, x: torch.Tensor, conv_state: torch.Tensor | None) -> torch.Tensor:
        """Causal depthwise conv over [previous K-1 inputs; x], then SiLU;
        the last K-1 inputs become the new conv state."""
        k = self.conv_kernel_size
        prev = (conv_state.t() if conv_state is not None
                else x.new_zeros(k - 1, self.d_inner))  # [K-1, D]
        seq = torch.cat((prev.to(x.dtype), x), dim=0)  # [K-1+L, D]
        if conv_state is not None:
            conv_state.copy_(seq[-(k - 1):].t())
        out = F.conv1d(seq.t().unsqueeze(0), self.conv1d.weight, self.conv1d.bias,
                       groups=self.d_inner)  # [1, D, L]
        return F.silu(out[0].t())
