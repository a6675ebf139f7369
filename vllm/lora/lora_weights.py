"""One adapted layer's LoRA weights (upstream: vllm/lora/lora_weights.py).

Layouts, as peft stores them: `lora_a` is [rank, input_dim] (peft's
`lora_A.weight`), `lora_b` is [output_dim, rank] (`lora_B.weight`); the
layer's output gains `scaling * x @ lora_a.T @ lora_b.T`. `optimize()` folds
the scaling into `lora_b` (then scaling is 1), which is what the runtime
layers consume. A packed layer (merged QKV, gate-up) holds one A/B pair per
slice, None for a slice the adapter does not target.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm.lora.peft_helper import PEFTHelper
from vllm.utils import is_pin_memory_available


class LoRALayerWeights:
    """LoRA weights for a layer composed of two low rank matrices."""

    def __init__(
        self,
        module_name: str,
        rank: int,
        lora_alpha: int,
        lora_a: torch.Tensor | None,
        lora_b: torch.Tensor | None,
        scaling: float | None = None,
    ) -> None:
        self.module_name = module_name
        self.rank = rank
        self.lora_alpha = lora_alpha
        # None only while a checkpoint is being read (from_config).
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.scaling = self.lora_alpha / self.rank if scaling is None else scaling

    def optimize(self) -> LoRALayerWeights:
        """Merge the scaling into lora_b (in place)."""
        if self.scaling == 1:
            return self
        assert self.lora_b is not None, f"{self.module_name}: lora_b not loaded"
        self.lora_b *= self.scaling
        self.scaling = 1
        return self

    @property
    def input_dim(self) -> int:
        assert self.lora_a is not None
        return self.lora_a.shape[1]

    @property
    def output_dim(self) -> int:
        assert self.lora_b is not None
        return self.lora_b.shape[0]

    @property
    def is_packed(self) -> bool:
        return False

    @classmethod
    def from_config(cls, module_name: str, peft_helper: PEFTHelper) -> LoRALayerWeights:
        """An empty entry (tensors set later) with the adapter's rank,
        alpha and scaling (rsLoRA included)."""
        return cls(
            module_name,
            peft_helper.r,
            peft_helper.lora_alpha,
            None,
            None,
            peft_helper.vllm_lora_scaling_factor,
        )

    @classmethod
    def create_dummy_lora_weights(
        cls,
        module_name: str,
        input_dim: int,
        output_dim: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.types.Device,
    ) -> LoRALayerWeights:
        """All-zero weights of the given shape (warm-up / profiling)."""
        pin_memory = str(device) == "cpu" and is_pin_memory_available()
        lora_a = torch.zeros([rank, input_dim], dtype=dtype, device=device, pin_memory=pin_memory)
        lora_b = torch.zeros([output_dim, rank], dtype=dtype, device=device, pin_memory=pin_memory)
        return cls(module_name, rank=rank, lora_alpha=1, lora_a=lora_a, lora_b=lora_b)


class PackedLoRALayerWeights(LoRALayerWeights):
    """LoRA for a packed layer (e.g. qkv_proj): `lora_a`, `lora_b` and
    `scaling` are lists with one entry per slice (None where the adapter has
    no weights for that slice), as upstream."""

    def __init__(
        self,
        module_name: str,
        rank: int,
        lora_alphas: list[int | None],
        lora_a: list[torch.Tensor | None],
        lora_b: list[torch.Tensor | None],
        scaling: list[float | None] | None = None,
    ) -> None:
        super().__init__(module_name=module_name, rank=rank, lora_alpha=0, lora_a=None, lora_b=None)
        self.lora_alphas = lora_alphas
        # Per-slice lists in the base class's attributes (upstream's layout).
        self.lora_a = lora_a  # type: ignore[assignment]
        self.lora_b = lora_b  # type: ignore[assignment]
        if scaling is None:
            scaling = [None if a is None else a / rank for a in lora_alphas]
        self.scaling = scaling  # type: ignore[assignment]

    @classmethod
    def pack(cls, loras: Sequence[LoRALayerWeights | None]) -> PackedLoRALayerWeights:
        """Pack per-slice LoRAs (None: the slice has no LoRA) into one, each
        slice's scaling folded into its lora_b first."""
        present = [lora for lora in loras if lora is not None]
        if not present:
            raise ValueError("pack() needs at least one LoRA.")
        for lora in present:
            lora.optimize()
        first = present[0]
        return cls(
            first.module_name,
            first.rank,
            [None if lora is None else lora.lora_alpha for lora in loras],
            [None if lora is None else lora.lora_a for lora in loras],
            [None if lora is None else lora.lora_b for lora in loras],
            scaling=[None if lora is None else 1.0 for lora in loras],
        )

    def optimize(self) -> PackedLoRALayerWeights:
        """Merge each slice's scaling into its lora_b (in place)."""
        slices_b: list[torch.Tensor | None] = self.lora_b  # type: ignore[assignment]
        scales: list[float | None] = self.scaling  # type: ignore[assignment]
        for i, lora_b in enumerate(slices_b):
            scale = scales[i]
            if lora_b is None or scale is None or scale == 1:
                continue
            lora_b *= scale
            scales[i] = 1.0
        return self

    @property
    def input_dim(self) -> int:
        raise NotImplementedError()

    @property
    def output_dim(self) -> int:
        raise NotImplementedError()

    @property
    def is_packed(self) -> bool:
        return True
