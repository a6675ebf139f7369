"""Batch metadata for the LoRA ops (upstream: vllm/lora/punica_wrapper/utils.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vllm.lora.layers.utils import LoRAMapping


def compute_meta(
    token_lora_tensor: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, bool]:
    """sgmv segments of a per-token slot tensor: runs of equal slots are one
    segment. Returns (segment starts, segment lengths, segment slots,
    number of segments, longest segment, number of tokens, no_lora), where
    no_lora means every token has slot -1."""
    slots, lengths = torch.unique_consecutive(token_lora_tensor, return_counts=True)
    starts = torch.zeros_like(lengths)
    starts[1:] = torch.cumsum(lengths, dim=0)[:-1]
    batch_size = slots.size(0)
    no_lora = batch_size == 1 and int(slots[0]) == -1
    return (
        starts,
        lengths,
        slots,
        batch_size,
        int(lengths.max()),
        int(lengths.sum()),
        no_lora,
    )


def convert_mapping(
    mapping: LoRAMapping,
    lora_index_to_id: list[int | None],
    max_loras: int,
    vocab_size: int,
    extra_vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """LoRA ids of a `LoRAMapping` -> slot tensors.

    `lora_index_to_id[slot]` is the LoRA id held in that slot (None = free).
    Returns (base_indices: slot per token, -1 = none; sampler_indices: slot per
    sampled row; sampler_indices_padded: sampled row r with slot s (-1 ->
    max_loras - 1) mapped to r + s * rows, upstream's index into per-slot
    logits; embeddings_indices `[2, tokens]`: slot * extra_vocab_size and
    slot * (vocab_size + extra_vocab_size), 0 for base tokens; the lengths of
    the four).
    """
    slot_of = {lid: slot for slot, lid in enumerate(lora_index_to_id) if lid is not None}

    def to_slot(lora_id: int) -> int:
        if lora_id <= 0:
            return -1
        if lora_id not in slot_of:
            raise ValueError(f"LoRA id {lora_id} is not in any slot")
        return slot_of[lora_id]

    token_slots = [to_slot(i) for i in mapping.index_mapping]
    base_indices = torch.tensor(token_slots, dtype=torch.long, device=device)
    sampler_indices = torch.tensor(
        [to_slot(i) for i in mapping.prompt_mapping], dtype=torch.long, device=device
    )
    embed_slot = torch.clamp(base_indices, min=0)
    embeddings_indices = torch.stack(
        [embed_slot * extra_vocab_size, embed_slot * (vocab_size + extra_vocab_size)]
    )
    rows = sampler_indices.size(0)
    padded = torch.where(sampler_indices == -1, max_loras - 1, sampler_indices)
    sampler_indices_padded = torch.arange(rows, device=device) + padded * rows
    lengths = [
        base_indices.size(-1),
        sampler_indices.size(-1),
        sampler_indices_padded.size(-1),
        embeddings_indices.size(-1),
    ]
    return base_indices, sampler_indices, sampler_indices_padded, embeddings_indices, lengths
