"""What a request carries per multimodal item (upstream: vllm/multimodal/inputs.py).

The types exist so that requests, and upstream's tests, can be built with the
same fields as upstream: a placeholder range in the prompt, the item's
processed tensors, and the identifier the prefix cache keys blocks by. No model
here consumes them: multimodal inputs are refused before they reach one.
"""

from __future__ import annotations

from collections import UserDict
from dataclasses import dataclass
from functools import cached_property
from typing import Union

import torch

NestedTensors = Union[  # noqa: UP007 (recursive alias: needs the string forward ref)
    list["NestedTensors"],
    list[torch.Tensor],
    torch.Tensor,
    tuple[torch.Tensor, ...],
]
"""A tensor, or (nested) lists of tensors whose shapes differ."""


def nested_tensors_equal(a: NestedTensors, b: NestedTensors) -> bool:
    """Equality of two `NestedTensors` (same nesting, equal tensors)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(b, torch.Tensor) or not isinstance(a, (list, tuple)):
        return False
    return (
        isinstance(b, (list, tuple))
        and len(a) == len(b)
        and all(nested_tensors_equal(x, y) for x, y in zip(a, b))
    )


@dataclass(frozen=True)
class PlaceholderRange:
    """Where one item's tokens sit in the prompt: `length` tokens from
    `offset`. `is_embed`, when set, is a bool mask of shape (length,) marking
    the positions that receive an embedding (the others are text tokens)."""

    offset: int
    length: int
    is_embed: torch.Tensor | None = None

    @cached_property
    def embeds_cumsum(self) -> list[int] | None:
        return None if self.is_embed is None else self.is_embed.cumsum(dim=0).tolist()

    def get_num_embeds(self) -> int:
        if self.embeds_cumsum is None:
            return self.length
        return self.embeds_cumsum[-1] if self.embeds_cumsum else 0

    def get_embeds_indices_in_range(self, start_idx: int, end_idx: int) -> tuple[int, int]:
        """The embeddings (indices into the item's encoder output) that fall in
        the placeholder positions [start_idx, end_idx)."""
        cumsum = self.embeds_cumsum
        if cumsum is None:
            return start_idx, end_idx
        start = cumsum[start_idx - 1] if start_idx > 0 else 0
        end = cumsum[end_idx - 1] if end_idx > 0 else 0
        return start, end

    def extract_embeds_range(self) -> list[tuple[int, int]]:
        """Inclusive (start, end) prompt positions of each run of embeddings."""
        if self.is_embed is None:
            return [(self.offset, self.offset + self.length - 1)]
        ranges: list[tuple[int, int]] = []
        mask = self.is_embed.tolist()
        i = 0
        while i < len(mask):
            if not mask[i]:
                i += 1
                continue
            j = i
            while j + 1 < len(mask) and mask[j + 1]:
                j += 1
            ranges.append((self.offset + i, self.offset + j))
            i = j + 1
        return ranges

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlaceholderRange):
            return False
        if (self.offset, self.length) != (other.offset, other.length):
            return False
        if self.is_embed is None or other.is_embed is None:
            return self.is_embed is None and other.is_embed is None
        return nested_tensors_equal(self.is_embed, other.is_embed)

    def __hash__(self) -> int:
        return hash((self.offset, self.length))


@dataclass
class MultiModalSharedField:
    """A field whose data is shared by `batch_size` items (upstream's
    `MultiModalFieldConfig.shared`)."""

    batch_size: int
    keep_on_cpu: bool = False


@dataclass
class MultiModalBatchedField:
    """A field whose data is one item's slice of a batched tensor."""

    keep_on_cpu: bool = False


@dataclass
class MultiModalFieldElem:
    """One keyword argument of one item: its data and how it batches."""

    data: NestedTensors | None
    field: MultiModalSharedField | MultiModalBatchedField

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiModalFieldElem) or self.field != other.field:
            return False
        if self.data is None or other.data is None:
            return self.data is None and other.data is None
        return nested_tensors_equal(self.data, other.data)


class MultiModalKwargsItem(UserDict[str, MultiModalFieldElem]):
    """The processed keyword arguments of one multimodal item."""

    @staticmethod
    def dummy(nbytes: int = 1) -> MultiModalKwargsItem:
        """An item holding `nbytes` bytes, for tests."""
        elem = MultiModalFieldElem(
            data=torch.empty(nbytes, dtype=torch.uint8), field=MultiModalSharedField(batch_size=1)
        )
        return MultiModalKwargsItem({"dummy": elem})

    def get_data(self) -> dict[str, NestedTensors | None]:
        return {key: elem.data for key, elem in self.items()}


@dataclass
class MultiModalFeatureSpec:
    """One multimodal item of a request.

    `identifier` keys the item's encoder output and its prefix-cache blocks
    (upstream prefixes it with the LoRA name when one is set); `mm_hash` is the
    processor-cache key. `data` is None when the item is already cached.
    """

    data: MultiModalKwargsItem | None
    modality: str
    identifier: str
    mm_position: PlaceholderRange
    mm_hash: str | None = None

    @staticmethod
    def gather_kwargs(
        features: list[MultiModalFeatureSpec], keys: set[str]
    ) -> dict[str, list[NestedTensors | None]]:
        kwargs: dict[str, list[NestedTensors | None]] = {}
        for feature in features:
            if feature.data is None:
                continue
            for key in keys:
                if key in feature.data:
                    kwargs.setdefault(key, []).append(feature.data[key].data)
        return kwargs
