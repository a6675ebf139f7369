"""Triton LoRA expand (upstream: vllm/lora/ops/triton_ops/lora_expand_op.py):
`output[t, off_s : off_s + n_s] (+)= inputs[s, t] @ B_s[slot(t)].T`, slices
side by side from `offset_start`; rows of tokens without an adapter are
never written.

Layouts: inputs `[num_slices, num_tokens, rank]` (the shrink output); each
`lora_b_weights[s]` `[max_loras, (1,) n_s, rank]`; output `[num_tokens,
total width]`. One launch per slice of the kernel shared with shrink
(kernel_utils.py; upstream: one launch for all).
"""

from __future__ import annotations

import torch

from vllm.lora.ops.triton_ops.kernel_utils import group_meta, launch_lora_tiles, stacked_weight

BLOCKS = (16, 64, 16)  # BLOCK_M (tokens), BLOCK_N (output columns), BLOCK_K (rank)


@torch.inference_mode()
def lora_expand(
    inputs: torch.Tensor,
    lora_b_weights: list[torch.Tensor] | tuple[torch.Tensor, ...],
    output_tensor: torch.Tensor,
    token_lora_mapping: torch.Tensor,
    token_indices_sorted_by_lora_ids: torch.Tensor,
    num_tokens_per_lora: torch.Tensor,
    lora_token_start_loc: torch.Tensor,
    lora_ids: torch.Tensor,
    no_lora_flag_cpu: torch.Tensor,
    num_active_loras: torch.Tensor,
    offset_start: int = 0,
    add_inputs: bool = False,
) -> None:
    """Metadata arguments as `LoRAKernelMeta.meta_args` returns them."""
    if bool(no_lora_flag_cpu.item()):
        return
    if inputs.dim() != 3 or inputs.size(0) != len(lora_b_weights):
        raise ValueError("inputs must be [num_slices, num_tokens, rank]")
    meta = group_meta(
        inputs.size(1),
        token_lora_mapping,
        token_indices_sorted_by_lora_ids,
        num_tokens_per_lora,
        lora_token_start_loc,
        lora_ids,
        num_active_loras,
    )
    offset = offset_start
    for s, weight in enumerate(lora_b_weights):
        w = stacked_weight(weight, inputs.size(2), f"lora_b weight {s}")
        end = offset + w.size(1)
        if end > output_tensor.size(1):
            raise ValueError(f"slice {s} ends at column {end} > {output_tensor.size(1)}")
        out = output_tensor[:, offset:end]
        launch_lora_tiles(inputs[s], w, out, meta, BLOCKS, add_inputs=add_inputs)
        offset = end
