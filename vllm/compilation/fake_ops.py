"""Fake (meta) kernels for the compiled CPU ops, so that dynamo can trace
through `torch.ops._C_cpu.*` without graph breaks.

The `_C_cpu` ops below mutate their `Tensor!` arguments in place and return
nothing (see csrc/cpu/torch_bindings.cpp), so their fake kernel only has to
exist: the output shapes are the caller's tensors. `panel_gemm` returns
its output, shaped by `_panel_gemm_fake`. The registrations are made
lazily, the first time compilation is requested, and only for the ops the
loaded `vllm._C` provides.
"""

from __future__ import annotations

import torch

# Every op in csrc/cpu/torch_bindings.cpp; each returns ().
_CPU_OPS = (
    "paged_attention_decode",
    "reshape_and_cache",
    "rms_norm",
    "fused_add_rms_norm",
    "fused_add_rms_norm_out",
    "rotary_embedding",
    "rotary_embedding_out",
    "silu_and_mul",
    "gumbel_argmax",
)

_registered: set[str] = set()


def _panel_gemm_fake(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """panel_gemm returns a new [..., N] tensor (N = 16 x packed's panels)."""
    return x.new_empty((*x.shape[:-1], packed.shape[0] * packed.shape[2]))


def _mutating_noop(*args: object, **kwargs: object) -> None:
    """Fake kernel of an in-place op that returns (): nothing to compute."""
    return None


def register_cpu_fake_ops() -> list[str]:
    """Register fake kernels for the loaded `_C_cpu` ops (idempotent).
    Returns the op names that have one."""
    from vllm import _custom_ops as ops

    if not ops.cpu_ops_available():
        return sorted(_registered)  # the torch fallbacks trace as they are
    for name in _CPU_OPS:
        if name in _registered or not hasattr(torch.ops._C_cpu, name):
            continue
        torch.library.register_fake(f"_C_cpu::{name}", _mutating_noop)
        _registered.add(name)
    if "panel_gemm" not in _registered and hasattr(torch.ops._C_cpu, "panel_gemm"):
        torch.library.register_fake("_C_cpu::panel_gemm", _panel_gemm_fake)
        _registered.add("panel_gemm")
    return sorted(_registered)
