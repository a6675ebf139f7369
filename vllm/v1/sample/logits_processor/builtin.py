"""The built-in logits processors of the V1 sampler: logit bias and min_tokens
(upstream: vllm/v1/sample/logits_processor/builtin.py).

Both edit a sparse set of (row, token) cells, so each keeps its per-row state
in a dict and, when that state changes, rebuilds flat index tensors for one
`index_put_` over the whole batch:

    rows = [0, 0, 2]    cols = [17, 99, 5]    ->  logits[rows, cols] op= values
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from vllm.v1.sample.logits_processor.interface import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

T = TypeVar("T")


def process_dict_updates(
    req_entries: dict[int, T],
    batch_update: BatchUpdate | None,
    new_state: Callable[[SamplingParams, list[int] | None, list[int]], T | None],
) -> bool:
    """Apply a `BatchUpdate` to per-row state kept as {row: entry}.

    `new_state(params, prompt_ids, output_ids)` makes the entry of an added
    request, or None when the processor has nothing to do for it. Returns
    whether any entry changed.
    """
    if batch_update is None:
        return False
    updated = False
    for index, params, prompt_ids, output_ids in batch_update.added:
        state = new_state(params, prompt_ids, output_ids)
        if state is not None:
            req_entries[index] = state
            updated = True
        elif req_entries.pop(index, None) is not None:
            updated = True  # a request without state took over the row
    if not req_entries:
        return updated
    for index in batch_update.removed:
        if req_entries.pop(index, None) is not None:
            updated = True
    for a, b, direction in batch_update.moved:
        a_entry = req_entries.pop(a, None)
        b_entry = req_entries.pop(b, None)
        if a_entry is not None:
            req_entries[b] = a_entry
            updated = True
        if b_entry is not None:
            updated = True
            if direction == MoveDirectionality.SWAP:
                req_entries[a] = b_entry
    return updated


class _SparseCellsProcessor(LogitsProcessor):
    """Shared machinery: per-row state -> (rows, cols, values) tensors."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.pin_memory = is_pin_memory
        assert vllm_config.model_config is not None, "logits processors are built for a model"
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        # (rows, cols, values) of the cells to change; None when there are none.
        self.cells: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def is_argmax_invariant(self) -> bool:
        return False

    def _build_cells(self, cells: list[tuple[int, int, float]]) -> None:
        if not cells:
            self.cells = None
            return
        rows, cols, values = zip(*cells)
        self.cells = (
            self._to_device(rows, torch.int64),
            self._to_device(cols, torch.int64),
            self._to_device(values, torch.float32),
        )

    def _to_device(self, data: tuple, dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(data, dtype=dtype, device="cpu", pin_memory=self.pin_memory)
        return t.to(self.device, non_blocking=True)


class LogitBiasLogitsProcessor(_SparseCellsProcessor):
    """Adds each request's `logit_bias` {token: bias} to its row."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        self.biases: dict[int, dict[int, float]] = {}

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not process_dict_updates(
            self.biases, batch_update, lambda params, _, __: params.logit_bias or None
        ):
            return
        self._build_cells(
            [
                (row, tok, bias)
                for row, bias_map in self.biases.items()
                for tok, bias in bias_map.items()
                if 0 <= tok < self.vocab_size
            ]
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cells is None:
            return logits
        rows, cols, values = self.cells
        return logits.index_put_((rows, cols), values.to(logits.dtype), accumulate=True)


class MinTokensLogitsProcessor(_SparseCellsProcessor):
    """Forbids the stop tokens (EOS, `stop_token_ids` and the generation
    config's extra EOS ids) of a request until it has `min_tokens` outputs."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        super().__init__(vllm_config, device, is_pin_memory)
        # row -> (min_tokens, the request's output token list, its stop ids)
        self.min_toks: dict[int, tuple[int, list[int], set[int]]] = {}

    @staticmethod
    def _new_state(
        params: SamplingParams, _prompt: list[int] | None, output_ids: list[int]
    ) -> tuple[int, list[int], set[int]] | None:
        min_tokens = params.min_tokens
        if min_tokens and len(output_ids) < min_tokens and params.all_stop_token_ids:
            return min_tokens, output_ids, params.all_stop_token_ids
        return None

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        changed = process_dict_updates(self.min_toks, batch_update, self._new_state)
        # The output lists grew since the last step: rows that reached their
        # min_tokens are released.
        done = [
            row for row, (min_tokens, out, _) in self.min_toks.items() if len(out) >= min_tokens
        ]
        for row in done:
            del self.min_toks[row]
        if changed or done:
            self._build_cells(
                [
                    (row, tok, float("-inf"))
                    for row, (_, _, stop_ids) in self.min_toks.items()
                    for tok in stop_ids
                    if 0 <= tok < self.vocab_size
                ]
            )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cells is None:
            return logits
        rows, cols, values = self.cells
        return logits.index_put_((rows, cols), values.to(logits.dtype))


BUILTIN_LOGITS_PROCESSORS: tuple[type[LogitsProcessor], ...] = (
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
)
