"""The Punica wrapper contract (upstream: vllm/lora/punica_wrapper/punica_base.py).

Punica (Chen et al. 2023, arXiv:2310.18547) serves many LoRA adapters in one
batch: every token carries the slot of its adapter and the LoRA layers call
the wrapper, which runs batched shrink (x @ A^T) and expand (@ B^T) ops.

Contract for subclasses (all methods update `y` in place; -1 = no adapter, whose
rows of `y` are never changed by the expand side):
- `update_metadata(mapping, lora_index_to_id, max_loras, vocab_size)` once per
  step, before any layer runs; token order = the order of `mapping.index_mapping`.
- `add_shrink(y, x, lora_a_stacked, scale)`: for each slice i,
  `y[i][t] = scale * x[t] @ lora_a_stacked[i][slot(t)].T`.
- `add_expand(y, x, lora_b_stacked, output_slices, offset_start, add_inputs)`:
  slices laid side by side from `offset_start`:
  `y[t, off_i:off_i+output_slices[i]] += x[i][t] @ lora_b_stacked[i][slot(t)].T`.
- `add_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale, output_slices)`:
  shrink then expand, several slices for merged QKV / gate-up projections.
- `add_lora_embedding(y, x, lora_b_stacked)`: expand only (x = the rows of
  the adapter's embedding A already looked up).
- `add_lora_logits(y, x, lora_a_stacked, lora_b_stacked, scale)`: shrink and
  expand keyed by the sampled rows' slots (`sampler_indices`).
Stacked weights: A `[max_loras, 1, rank, in]`, B `[max_loras, 1, out, rank]`
(the size-1 dim optional).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from vllm.lora.punica_wrapper.utils import compute_meta, convert_mapping

if TYPE_CHECKING:
    from vllm.lora.layers.utils import LoRAMapping


class PunicaWrapperABC(ABC):
    """The abstract interface (see the module docstring for semantics)."""

    @abstractmethod
    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None: ...

    @abstractmethod
    def add_shrink(
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> torch.Tensor | None: ...

    @abstractmethod
    def add_expand(
        self,
        y: torch.Tensor,
        x: tuple[torch.Tensor, ...] | torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor | None: ...

    @abstractmethod
    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor | None: ...

    @abstractmethod
    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor | None: ...

    @abstractmethod
    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale: float,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor | None: ...


class PunicaWrapperBase(PunicaWrapperABC):
    """Holds the per-step slot metadata in preallocated tensors (sized for
    `max_num_batched_tokens` tokens and `max_batches` sgmv segments)."""

    def __init__(
        self,
        max_num_batched_tokens: int,
        max_batches: int,
        device: torch.device | str,
        **kwargs: Any,
    ) -> None:
        n = max_num_batched_tokens

        def buf(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, dtype=torch.long, device=device)

        self._token_lora_indices = buf(n)
        self._sampler_indices = buf(n)
        self._sampler_indices_padded = buf(n)
        self._embeddings_indices = buf(2, n)
        # Lengths of: token, sampler, padded sampler, embeddings indices.
        self.indices_len: list[int | None] = [None] * 4
        self._seq_start_locs = buf(max_batches)
        self._seq_lengths = buf(max_batches)
        self._lora_indices_per_batch = buf(max_batches)
        self.device: torch.device | str = device
        self.max_num_batched_tokens = n
        self.max_length = 0
        self.token_nums = 0
        self.batch_size = -1
        self.is_prefill = False
        self.no_lora = False

    def _update_base_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
    ) -> None:
        if len(mapping.index_mapping) > self.max_num_batched_tokens:
            raise ValueError(
                f"{len(mapping.index_mapping)} tokens exceed max_num_batched_tokens "
                f"({self.max_num_batched_tokens})"
            )
        # Extra (adapter-added) vocabulary is not supported, as upstream v0.28.
        base, sampler, padded, embeddings, lengths = convert_mapping(
            mapping, lora_index_to_id, max_loras, vocab_size, 0, self.device
        )
        self._token_lora_indices[: base.size(0)].copy_(base)
        self._sampler_indices[: sampler.size(0)].copy_(sampler)
        self._sampler_indices_padded[: padded.size(0)].copy_(padded)
        self._embeddings_indices[:, : embeddings.size(1)].copy_(embeddings)
        self.indices_len[:] = lengths

    def _update_prefill_metadata(self, token_lora_tensor: torch.Tensor) -> None:
        starts, lengths, slots, batch_size, max_length, token_nums, no_lora = compute_meta(
            token_lora_tensor
        )
        if batch_size > self._seq_start_locs.size(0):
            raise ValueError(f"{batch_size} segments exceed max_batches")
        self._seq_start_locs[:batch_size].copy_(starts)
        self._seq_lengths[:batch_size].copy_(lengths)
        self._lora_indices_per_batch[:batch_size].copy_(slots)
        self.batch_size = batch_size
        self.max_length = max_length
        self.token_nums = token_nums
        self.no_lora = no_lora

    @property
    def prefill_metadata(
        self,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
        """sgmv arguments: (segment starts, lengths, slots, segments, longest, tokens)."""
        b = self.batch_size
        return (
            self._seq_start_locs[:b],
            self._seq_lengths[:b],
            self._lora_indices_per_batch[:b],
            b,
            self.max_length,
            self.token_nums,
        )

    @property
    def token_lora_indices(self) -> torch.Tensor:
        """Slot of each batch token (-1 = no adapter)."""
        return self._token_lora_indices[: self.indices_len[0]]

    @property
    def sampler_indices(self) -> torch.Tensor:
        """Slot of each sampled row (for the logits LoRA)."""
        return self._sampler_indices[: self.indices_len[1]]

    @property
    def sampler_indices_padded(self) -> torch.Tensor:
        return self._sampler_indices_padded[: self.indices_len[2]]

    @property
    def embeddings_indices(self) -> torch.Tensor:
        return self._embeddings_indices[:, : self.indices_len[3]]

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        self._update_base_metadata(mapping, lora_index_to_id, max_loras, vocab_size)
        self.is_prefill = mapping.is_prefill
        if mapping.is_prefill:
            self._update_prefill_metadata(self.token_lora_indices)
