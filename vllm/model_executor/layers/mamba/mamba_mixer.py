"""The Mamba-1 mixer (upstream: vllm/model_executor/layers/mamba/mamba_mixer.py),
in PyTorch: causal depthwise conv + selective scan, all requests of a step
batched (ops/: one-token decode step, chunked parallel scan for prefills).

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
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.mamba.ops.causal_conv1d import (
    causal_conv1d_fn,
    causal_conv1d_update,
)
from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_scan_fn, selective_state_update
from vllm.model_executor.layers.mamba.ops.varlen import StateGroup, build_state_groups
from vllm.v1.attention.backends.mamba1_attn import Mamba1AttentionBackend
from vllm.v1.kv_cache_interface import MambaSpec, get_max_model_len

if TYPE_CHECKING:
    from vllm.config import VllmConfig


class MambaMixer(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        ssm_state_size: int,
        conv_kernel_size: int,
        intermediate_size: int,
        time_step_rank: int,
        use_conv_bias: bool,
        use_bias: bool,
        activation: str = "silu",
        prefix: str = "",
    ) -> None:
        super().__init__()
        if activation != "silu":
            raise ValueError(f"Mamba activation {activation!r} is not supported.")
        vllm_config = get_current_vllm_config()
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise NotImplementedError("Mamba with tensor parallelism is not built.")
        self.d_inner, self.d_state = intermediate_size, ssm_state_size
        self.conv_kernel_size, self.time_step_rank = conv_kernel_size, time_step_rank
        self.in_proj = ColumnParallelLinear(
            hidden_size, 2 * intermediate_size, bias=use_bias, prefix=f"{prefix}.in_proj"
        )
        # Depthwise conv, stored like nn.Conv1d: [D, 1, K].
        self.conv1d = nn.Conv1d(
            intermediate_size,
            intermediate_size,
            conv_kernel_size,
            groups=intermediate_size,
            bias=use_conv_bias,
        )
        self.conv1d.requires_grad_(False)
        self.x_proj = ReplicatedLinear(
            intermediate_size,
            time_step_rank + 2 * ssm_state_size,
            bias=False,
            prefix=f"{prefix}.x_proj",
        )
        self.dt_proj = ColumnParallelLinear(
            time_step_rank, intermediate_size, bias=True, prefix=f"{prefix}.dt_proj"
        )
        self.A_log = nn.Parameter(
            torch.empty(intermediate_size, ssm_state_size), requires_grad=False
        )
        self.D = nn.Parameter(torch.empty(intermediate_size), requires_grad=False)
        self.out_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=use_bias, prefix=f"{prefix}.out_proj"
        )
        self.layer_name = prefix
        self.dtype = torch.get_default_dtype()
        vllm_config.compilation_config.register_stateful_layer(prefix, self, "Mamba")
        self.kv_cache: list = [()]  # bound by the runner: (conv_states, ssm_states)

    def get_attn_backend(self) -> type[Mamba1AttentionBackend]:
        return Mamba1AttentionBackend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> MambaSpec:
        return MambaSpec(
            block_size=get_max_model_len(vllm_config),
            shapes=((self.d_inner, self.conv_kernel_size - 1), (self.d_inner, self.d_state)),
            dtypes=(self.dtype, self.dtype),
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [T, H] -> [T, H]; each request's tokens are scanned
        from its slot's state (or zeros) and the slot gets the final state.
        Requests are batched: decodes in one step, prefills in one chunked scan."""
        ctx = get_forward_context()
        md = ctx.attn_metadata[self.layer_name] if ctx.attn_metadata else None
        xz, _ = self.in_proj(hidden_states)
        x, z = xz.chunk(2, dim=-1)  # [T, D] each
        if md is None:  # dummy / profiling run: one stateless sequence
            groups, states = build_state_groups([0, x.shape[0]], x.device), None
        else:
            groups, states = md.state_groups, self.kv_cache[ctx.virtual_engine]
        y = torch.zeros_like(x)  # tokens past the scheduled ones (padding) stay 0
        for group in groups:
            y[group.flat_index] = self._run_group(x, z, group, states)
        out, _ = self.out_proj(y)
        return out

    def _run_group(
        self,
        x: torch.Tensor,
        z: torch.Tensor,
        group: StateGroup,
        states: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """One group's tokens: x, z [T, D] (the whole step) -> [n, D] for
        group.flat_index; the group's state slots are updated."""
        g, length = group.token_index.shape
        xg = x[group.token_index]  # [G, L, D]
        if states is not None:
            conv_in = group.gather_states(states[0], x.dtype)
            h0 = group.gather_states(states[1], torch.float32)
        else:
            conv_in = x.new_zeros(g, self.d_inner, self.conv_kernel_size - 1)
            h0 = None
        weight, bias = self.conv1d.weight, self.conv1d.bias
        if length == 1:
            u, conv_out = causal_conv1d_update(xg[:, 0], conv_in, weight, bias)
            u = u[:, None]
        else:
            u, conv_out = causal_conv1d_fn(xg, weight, bias, conv_in, group.lengths)
        params, _ = self.x_proj(u.reshape(g * length, -1))
        dt, b, c = params.split([self.time_step_rank, self.d_state, self.d_state], dim=-1)
        dt, _ = self.dt_proj(dt)
        # dt = 0 on padding: the state passes it unchanged.
        dt = F.softplus(dt.float()).view(g, length, -1) * group.mask[..., None]
        b, c = b.reshape(g, length, -1), c.reshape(g, length, -1)
        a = -torch.exp(self.A_log.float())  # [D, N]
        zg = z[group.token_index]
        if length == 1:
            y, h = selective_state_update(
                h0 if h0 is not None else u.new_zeros(g, *a.shape, dtype=torch.float32),
                u[:, 0],
                dt[:, 0],
                a,
                b[:, 0],
                c[:, 0],
                self.D,
                zg[:, 0],
            )
            y = y[:, None]
        else:
            y, h = selective_scan_fn(u, dt, a, b, c, self.D, zg, h0)
        if states is not None:
            group.scatter_states(states[0], conv_out)
            group.scatter_states(states[1], h)
        return y[group.mask].to(x.dtype)
