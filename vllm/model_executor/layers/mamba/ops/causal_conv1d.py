"""Causal depthwise conv1d over batched sequences with carried state
(upstream: vllm/model_executor/layers/mamba/ops/causal_conv1d.py).

The conv state of a sequence is its last K - 1 inputs, [C, K - 1] (oldest
first); a sequence continues from it as if those inputs preceded its tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"Unsupported conv activation {activation!r}.")


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    lengths: torch.Tensor,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [G, L, C] (request g's tokens at [g, :lengths[g]], padding after),
    weight [C, K] or [C, 1, K], conv_state [G, C, K-1] -> (out [G, L, C],
    new conv_state [G, C, K-1]: the last K-1 inputs before each request's padding)."""
    channels = x.shape[-1]
    weight = weight.reshape(channels, 1, -1)
    k = weight.shape[-1]
    seq = torch.cat((conv_state.to(x.dtype).transpose(1, 2), x), dim=1)  # [G, K-1+L, C]
    out = F.conv1d(seq.transpose(1, 2), weight, bias, groups=channels)  # [G, C, L]
    # seq holds K-1 state inputs then the tokens: request g's last K-1 inputs
    # are seq[g, lengths[g] : lengths[g] + K - 1].
    idx = lengths[:, None] + torch.arange(k - 1, device=x.device)[None, :]
    new_state = seq.gather(1, idx[:, :, None].expand(-1, -1, channels)).transpose(1, 2)
    return _activate(out.transpose(1, 2), activation), new_state


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None = "silu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: x [G, C], conv_state [G, C, K-1] ->
    (out [G, C], new conv_state [G, C, K-1])."""
    channels = x.shape[-1]
    weight = weight.reshape(channels, -1)  # [C, K]
    seq = torch.cat((conv_state.to(x.dtype), x[:, :, None]), dim=-1)  # [G, C, K]
    out = (seq * weight).sum(-1)
    if bias is not None:
        out = out + bias
    return _activate(out, activation), seq[:, :, 1:]
