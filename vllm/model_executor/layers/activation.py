"""Activation functions (upstream: vllm/model_executor/layers/activation.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vllm import _custom_ops as ops


class SiluAndMul(nn.Module):
    """The SwiGLU gate: x = [gate; up] along the last dim -> silu(gate) * up.

    Shapes: x [..., 2 * d] -> [..., d].
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        if ops.has_compiled_ops(x):
            # One pass (csrc/cpu/activation.cpp, csrc/activation_kernels.cu)
            # instead of silu + mul.
            out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
            ops.silu_and_mul(out, x)
            return out
        return F.silu(x[..., :d]).mul_(x[..., d:])  # in place on the fresh silu output


class GeluAndMul(nn.Module):
    """x = [gate; up] -> gelu(gate) * up, exact ("none") or tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"Unknown approximate mode: {approximate}")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate).mul_(x[..., d:])


_ACTIVATION_AND_MUL = {"silu": SiluAndMul, "swish": SiluAndMul}


def get_act_and_mul_fn(act_fn_name: str) -> nn.Module:
    """The gated activation for an HF `hidden_act` name."""
    name = act_fn_name.lower()
    if name in _ACTIVATION_AND_MUL:
        return _ACTIVATION_AND_MUL[name]()
    if name in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        return GeluAndMul("none" if name == "gelu" else "tanh")
    raise ValueError(f"Activation function {act_fn_name!r} is not supported.")


def _gelu_tanh() -> nn.Module:
    return nn.GELU(approximate="tanh")


# HF `hidden_act` name -> a plain (ungated) activation. "gelu" is the exact erf
# GELU; "gelu_new" / "gelu_pytorch_tanh" / "gelu_fast" are its tanh
# approximation (the same function, written three ways in transformers).
_ACTIVATIONS = {
    "gelu": nn.GELU,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
}


def get_act_fn(act_fn_name: str) -> nn.Module:
    """The activation module for an HF `hidden_act` name (upstream's get_act_fn)."""
    factory = _ACTIVATIONS.get(act_fn_name.lower())
    if factory is None:
        raise ValueError(f"Activation function {act_fn_name!r} is not supported.")
    return factory()
