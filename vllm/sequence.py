"""Data passed between pipeline stages (upstream: vllm/sequence.py)."""

from __future__ import annotations

from collections.abc import ItemsView
from dataclasses import dataclass
from typing import overload

import torch


@dataclass
class IntermediateTensors:
    """The hidden state one pipeline stage hands the next: name -> tensor,
    each [num_tokens, ...] (for decoder models "hidden_states" and "residual")."""

    tensors: dict[str, torch.Tensor]

    @overload
    def __getitem__(self, key: str) -> torch.Tensor: ...

    @overload
    def __getitem__(self, key: slice) -> IntermediateTensors: ...

    def __getitem__(self, key: str | slice) -> torch.Tensor | IntermediateTensors:
        """A tensor by name, or every tensor sliced along the token dim."""
        if isinstance(key, str):
            return self.tensors[key]
        return IntermediateTensors({k: v[key] for k, v in self.tensors.items()})

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.tensors[key] = value

    def items(self) -> ItemsView[str, torch.Tensor]:
        return self.tensors.items()

    def __len__(self) -> int:
        return len(self.tensors)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IntermediateTensors):
            return False
        if self.tensors.keys() != other.tensors.keys():
            return False
        return all(torch.equal(v, other.tensors[k]) for k, v in self.tensors.items())

    def __repr__(self) -> str:
        return f"IntermediateTensors(tensors={self.tensors})"
