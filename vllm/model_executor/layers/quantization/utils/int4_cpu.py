"""int4 weight-only linear on the CPU, shared by every 4-bit method
(compressed-tensors W4A16, GPTQ, AWQ, GGUF Q4_*).

API (stable):
  pack_int4_cpu(u, scale, zero) -> (packed, scale_and_zero)
    u      int32 [N, K], values 0..15 (N = output features, K = input features);
    scale  [N, K / group_size], zero [N, K / group_size] (any float dtype);
    the dense weight it stands for is  w[n, k] = (u[n, k] - 8) * scale[n, g] + zero[n, g],
    g = k // group_size  (torch's int4 kernel's own convention; a method with
    w = (u - z) * s passes zero = (8 - z) * s).
    scale's dtype is the activation dtype the layer will run with (its
    params_dtype), and picks one of two stored forms:
    - bfloat16 / float16: torch's int4 kernel. packed =
      `aten._convert_weight_to_int4pack_for_cpu(u, 1)` (uint8 [N, K / 2], two
      values per byte); scale_and_zero [K / group_size, N, 2] in scale's dtype,
      [..., 0] the scale, [..., 1] the zero.
    - float32: torch's int4 kernel is ~100x slower with float32 activations
      (20-76 ms vs 0.07-0.2 ms at 16 rows, 576-3072 x 576, AVX-512 CPU), so the
      same values go to `vllm._custom_ops.int8_group_gemm`: packed = u - 8 as
      int8 [N, K] (one value per byte: twice the int4 bytes); scale_and_zero
      float32 [2, N, K / group_size] ([0] the scale, [1] the zero), or
      [1, N, K / group_size] when every zero is 0 (symmetric: no offset pass).
  int4_cpu_linear(x, packed, scale_and_zero, group_size, bias) -> y
    x [..., K] (float32 / bfloat16 / float16) -> y [..., N] = x @ w.T (+ bias), x's dtype;
    either stored form (told apart by packed's dtype: uint8 int4, int8 int8-group).

group_size must be one of INT4_GROUP_SIZES (what `_weight_int4pack_mm_for_cpu`
takes); K must be a multiple of group_size.
"""

from __future__ import annotations

import torch

# _weight_int4pack_mm_for_cpu's group sizes.
INT4_GROUP_SIZES = (32, 64, 128, 256)


def pack_int4_cpu(
    u: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repack unsigned int4 values and their per-group (scale, zero) for the
    kernel that scale's dtype (the activation dtype) will run (module docstring)."""
    if u.dim() != 2 or scale.shape != zero.shape or scale.shape[0] != u.shape[0]:
        raise ValueError(
            f"pack_int4_cpu: u {tuple(u.shape)}, scale {tuple(scale.shape)} and zero "
            f"{tuple(zero.shape)} do not describe one [N, K] weight with [N, groups] pairs."
        )
    if scale.dtype == torch.float32:
        q = (u.to(torch.int16) - 8).to(torch.int8).contiguous()
        zero32 = zero.to(torch.float32)
        pairs = [scale] if not bool(zero32.any()) else [scale, zero32]
        return q, torch.stack(pairs).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.to(torch.int32).contiguous(), 1)
    # [N, groups] -> [groups, N, (scale, zero)].
    scale_and_zero = torch.stack([scale.t(), zero.to(scale.dtype).t()], dim=-1).contiguous()
    return packed, scale_and_zero


def int4_cpu_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_and_zero: torch.Tensor,
    group_size: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ dequantized(packed).T (+ bias) -> [..., N] in x's dtype."""
    if packed.dtype == torch.int8:  # the float32 form: int8 values, fp32 groups
        from vllm import _custom_ops as ops

        offsets = scale_and_zero[1] if scale_and_zero.shape[0] == 2 else None
        out = ops.int8_group_gemm(x, packed, scale_and_zero[0], group_size, offsets)
        return out if bias is None else out + bias
    x2d = x.reshape(-1, x.shape[-1])
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        x2d, packed, group_size, scale_and_zero.to(x.dtype)
    )
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])
