"""Punica wrapper over the Triton kernels (upstream:
vllm/lora/punica_wrapper/punica_gpu.py). One `LoRAKernelMeta` for the batch
tokens and one for the sampled rows (logits), refreshed by update_metadata.
Runs on CUDA tensors, and on CPU tensors under TRITON_INTERPRET=1."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, final

import torch

from vllm.lora.ops.triton_ops import LoRAKernelMeta, lora_expand, lora_shrink
from vllm.lora.ops.triton_ops.lora_kernel_metadata import MetaArgs
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase

if TYPE_CHECKING:
    from vllm.lora.layers.utils import LoRAMapping


@final
class PunicaWrapperGPU(PunicaWrapperBase):
    """Takes `lora_config=` (upstream; its `max_loras` and
    `specialize_active_lora` are read) or, without one, `max_loras=`."""

    def __init__(
        self,
        max_num_batched_tokens: int,
        max_batches: int,
        device: torch.device | str,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_num_batched_tokens, max_batches, device)
        lora_config = kwargs.get("lora_config")
        if lora_config is not None:
            self.max_loras = int(lora_config.max_loras)
            self.specialize_active_lora = bool(
                getattr(lora_config, "specialize_active_lora", False)
            )
        elif "max_loras" in kwargs:
            self.max_loras = int(kwargs["max_loras"])
            self.specialize_active_lora = False
        else:
            raise TypeError("PunicaWrapperGPU needs lora_config= or max_loras=")
        self.token_mapping_meta = LoRAKernelMeta.make(
            self.max_loras, max_num_batched_tokens, device
        )
        self.prompt_mapping_meta = LoRAKernelMeta.make(
            self.max_loras, max_num_batched_tokens, device
        )

    def update_metadata(
        self,
        mapping: LoRAMapping,
        lora_index_to_id: list[int | None],
        max_loras: int,
        vocab_size: int,
        **kwargs: Any,
    ) -> None:
        self.is_prefill = mapping.is_prefill
        self._update_base_metadata(mapping, lora_index_to_id, max_loras, vocab_size)
        self.token_mapping_meta.prepare_tensors(self.token_lora_indices)
        self.prompt_mapping_meta.prepare_tensors(self.sampler_indices)

    def _token_meta(self, n: int) -> MetaArgs:
        return self.token_mapping_meta.meta_args(n, self.specialize_active_lora)

    def add_shrink(
        self,
        y: tuple[torch.Tensor, ...] | torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        scale: float,
        **kwargs: Any,
    ) -> None:
        """`y` is one `[num_slices, num_tokens, rank]` tensor here."""
        assert isinstance(y, torch.Tensor)
        x = x.view(-1, x.size(-1))
        lora_shrink(x, lora_a_stacked, y, *self._token_meta(x.size(0)), scale)

    def add_expand(
        self,
        y: torch.Tensor,
        x: tuple[torch.Tensor, ...] | torch.Tensor,
        lora_b_stacked: tuple[torch.Tensor, ...],
        output_slices: tuple[int, ...],
        offset_start: int = 0,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        """`x` is one `[num_slices, num_tokens, rank]` tensor here."""
        assert isinstance(x, torch.Tensor) and x.dim() == 3
        if x.size(0) != len(output_slices):
            raise ValueError(f"{x.size(0)} input slices for {len(output_slices)} outputs")
        y2 = y.view(-1, y.size(-1))
        lora_expand(
            x,
            lora_b_stacked,
            y2,
            *self._token_meta(x.size(1)),
            offset_start=offset_start,
            add_inputs=add_inputs,
        )

    def add_lora_embedding(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        add_inputs: bool = True,
        **kwargs: Any,
    ) -> None:
        lora_expand(
            x.unsqueeze(0),
            (lora_b_stacked,),
            y,
            *self._token_meta(x.size(0)),
            offset_start=0,
            add_inputs=add_inputs,
        )

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
    ) -> None:
        """Shrink into a float32 `[slices, tokens, rank]` buffer (as upstream,
        built here: passing one is refused), then expand."""
        if not len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices):
            raise ValueError("lora_a_stacked, lora_b_stacked, output_slices differ in length")
        if buffer is not None:
            raise ValueError("PunicaWrapperGPU.add_lora_linear builds its own buffer")
        x = x.view(-1, x.size(-1))
        rank = lora_b_stacked[0].size(-1)
        buf = torch.empty(
            (len(output_slices), x.size(0), rank), dtype=torch.float32, device=x.device
        )
        add_inputs = kwargs.pop("add_inputs", True)
        self.add_shrink(buf, x, lora_a_stacked, scale)
        self.add_expand(y, buf, lora_b_stacked, output_slices, add_inputs=add_inputs)

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
    ) -> None:
        if buffer is not None:
            raise ValueError("PunicaWrapperGPU.add_lora_logits builds its own buffer")
        y2 = y.view(-1, y.size(-1))
        x = x.view(-1, x.size(-1))
        rank = lora_b_stacked.size(-1)
        buf = torch.empty((1, x.size(0), rank), dtype=torch.float32, device=x.device)
        meta = self.prompt_mapping_meta.meta_args(x.size(0), self.specialize_active_lora)
        lora_shrink(x, (lora_a_stacked,), buf, *meta, scale)
        lora_expand(buf, (lora_b_stacked,), y2, *meta, add_inputs=True)
