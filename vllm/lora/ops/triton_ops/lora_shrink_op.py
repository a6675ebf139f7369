"""Triton LoRA shrink (upstream: vllm/lora/ops/triton_ops/lora_shrink_op.py):
`output[s, t, :rank] = scaling * inputs[t] @ A_s[slot(t)].T` for every slice
s; rows of tokens without an adapter are 0 (the output is zeroed first).

Layouts: inputs `[num_tokens, hidden]`; each `lora_a_weights[s]`
`[max_loras, (1,) rank, hidden]`; output `[num_slices, num_tokens, rank]`
(float32 in the Punica wrapper). Unlike upstream (one launch over all slices
through a table of weight pointers) each slice is one launch of the kernel
shared with expand (kernel_utils.py); unlike upstream, float32 weights are
accepted (multiplied at full precision).
"""

from __future__ import annotations

import torch

from vllm.lora.ops.triton_ops.kernel_utils import group_meta, launch_lora_tiles, stacked_weight

BLOCKS = (16, 16, 64)  # BLOCK_M (tokens), BLOCK_N (rank), BLOCK_K (hidden)


@torch.inference_mode()
def lora_shrink(
    inputs: torch.Tensor,
    lora_a_weights: list[torch.Tensor] | tuple[torch.Tensor, ...],
    output_tensor: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    token_indices_sorted_by_lora_ids: torch.Tensor,
    num_tokens_per_lora: torch.Tensor,
    lora_token_start_loc: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
    scaling: float,
) -> None:
    """Metadata arguments as `LoRAKernelMeta.meta_args` returns them."""
    if bool(no_lora_flag_cpu.item()):
        return
    if inputs.dim() != 2:
        raise ValueError("inputs must be [num_tokens, hidden]")
    meta = group_meta(
        inputs.size(0),
        token_lora_mapping,
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
        num_active_loras,
    )
    if output_tensor.dim() != 3 or output_tensor.size(0) != len(lora_a_weights):
        raise ValueError("output_tensor must be [num_slices, num_tokens, rank]")
    output_tensor.zero_()
    for s, weight in enumerate(lora_a_weights):
        w = stacked_weight(weight, inputs.size(1), f"lora_a weight {s}")
        launch_lora_tiles(inputs, w, output_tensor[s], meta, BLOCKS, scaling=scaling)
