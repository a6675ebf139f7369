"""Per-step metadata of the Triton LoRA kernels (upstream:
vllm/lora/ops/triton_ops/lora_kernel_metadata.py).

From the per-token slot mapping (-1 = no adapter) it derives, in
preallocated tensors: the token indices sorted by slot (stable), the slots
present (`active_lora_ids`, ascending, -1 included when base tokens are
present, padded with -1), the token count per slot and its exclusive prefix
sum (`lora_token_start_loc`, first element 0). Slot `active_lora_ids[i]`
owns the tokens `sorted[start[i] : start[i] + count[i]]`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

# The metadata arguments of lora_shrink / lora_expand, in order.
MetaArgs = tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]


@dataclass
class LoRAKernelMeta:
    token_lora_mapping: torch.Tensor
    token_indices_sorted_by_lora_ids: torch.Tensor
    active_lora_ids: torch.Tensor
    num_tokens_per_lora: torch.Tensor
    lora_token_start_loc: torch.Tensor
    # CPU tensors (not Python scalars) so a traced graph reads them at run time.
    no_lora_flag_cpu: torch.Tensor
    num_active_loras_cpu: torch.Tensor
    default_num_active_loras_cpu: torch.Tensor
    # Sorted LoRA counts captured in CUDA graphs; the active count is rounded
    # up to one of them when specializing (empty: no rounding).
    captured_lora_counts: list[int] = field(default_factory=list)

    @staticmethod
    def make(
        max_loras: int,
        max_num_tokens: int,
        device: torch.device | str,
        captured_lora_counts: list[int] | None = None,
    ) -> LoRAKernelMeta:
        def i32(n: int, fill: int | None = None) -> torch.Tensor:
            t = torch.empty(n, dtype=torch.int32, device=device)
            return t if fill is None else t.fill_(fill)

        return LoRAKernelMeta(
            token_lora_mapping=i32(max_num_tokens),
            token_indices_sorted_by_lora_ids=i32(max_num_tokens),
            # +1: "no adapter" (-1) is one more possible group.
            active_lora_ids=i32(max_loras + 1, -1),
            num_tokens_per_lora=i32(max_loras + 1, 0),
            lora_token_start_loc=i32(max_loras + 2, 0),
            no_lora_flag_cpu=torch.tensor([False]),
            num_active_loras_cpu=torch.tensor([0], dtype=torch.int32),
            default_num_active_loras_cpu=torch.tensor([max_loras + 1], dtype=torch.int32),
            captured_lora_counts=sorted(captured_lora_counts or []),
        )

    def _reset(self) -> None:
        self.active_lora_ids.fill_(-1)
        self.num_tokens_per_lora.fill_(0)
        self.lora_token_start_loc.fill_(0)
        self.no_lora_flag_cpu.fill_(False)
        self.num_active_loras_cpu.fill_(0)

    def prepare_tensors(self, token_lora_mapping: torch.Tensor) -> None:
        """Fill the metadata for this step's per-token slots."""
        self._reset()
        no_lora = bool((token_lora_mapping == -1).all())
        self.no_lora_flag_cpu[0] = no_lora
        if no_lora:
            return  # the kernels return at once
        n = token_lora_mapping.size(0)
        self.token_lora_mapping[:n].copy_(token_lora_mapping)
        _, order = torch.sort(token_lora_mapping, stable=True)
        self.token_indices_sorted_by_lora_ids[:n].copy_(order)
        ids, counts = torch.unique(token_lora_mapping, sorted=True, return_counts=True)
        self.active_lora_ids[: ids.size(0)].copy_(ids)
        self.num_tokens_per_lora[: counts.size(0)].copy_(counts)
        self.lora_token_start_loc[1 : 1 + counts.size(0)].copy_(torch.cumsum(counts, 0))
        active = ids.size(0)
        if self.captured_lora_counts:
            i = bisect.bisect_left(self.captured_lora_counts, active)
            if i < len(self.captured_lora_counts):
                active = self.captured_lora_counts[i]
        self.num_active_loras_cpu[0] = active

    def meta_args(self, token_nums: int, specialize_active_lora: bool) -> MetaArgs:
        """The metadata arguments of `lora_shrink` / `lora_expand`, in order."""
        active = (
            self.num_active_loras_cpu
            if specialize_active_lora
            else self.default_num_active_loras_cpu
        )
        return (
            self.token_lora_mapping[:token_nums],
            self.token_indices_sorted_by_lora_ids[:token_nums],
            self.num_tokens_per_lora,
            self.lora_token_start_loc,
            self.active_lora_ids,
            self.no_lora_flag_cpu,
            active,
        )
