"""The built-in logits processors of the V1 sampler: logit bias and min_tokens
(upstream: vllm/v1/sample/logits_processor/builtin.py).

Both edit a sparse set of (row, token) cells, so each keeps its per-row state
in a dict and, when that state changes, rebuilds flat index tensors for one
`index_put_` over the whole batch:

    rows = [0, 0, 2]    cols = [17, 99, 5]    ->  logits[rows, cols] op= values

Under speculative decoding the rows being sampled are not batch rows but
(request, position) pairs: each request's draft positions, then its bonus
position. `apply_at_positions` takes that layout: logits row i belongs to
batch row req[i] and is the token at `pos[i]` past the request's outputs
(0 = the next token). The cells of each batch row are kept contiguous (sorted
by row), so each logits row picks its request's run of cells:

    cells rows [0, 0, 2]     -> row_start [0, 2, 2], row_count [2, 0, 1]
    req = [0, 0, 2], pos = [0, 1, 0]   (request 0: a draft + bonus; request 2: bonus)
    -> logits rows 0 and 1 get cells 0..1, logits row 2 gets cell 2
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


class SparseCellsLogitsProcessor(LogitsProcessor):
    """Shared machinery: per-row state -> (rows, cols, values) tensors."""

    # index_put_ accumulates (logit bias) or overwrites (masks).
    accumulate = False

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.pin_memory = is_pin_memory
        assert vllm_config.model_config is not None, "logits processors are built for a model"
        self.vocab_size = vllm_config.model_config.get_vocab_size()
        # (rows, cols, values) of the cells to change, sorted by row; None
        # when there are none.
        self.cells: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # [max row + 2] int64 each: first cell and number of cells of each
        # batch row; the last entry (0 cells) stands for every row past it.
        self.row_start: torch.Tensor | None = None
        self.row_count: torch.Tensor | None = None

    def is_argmax_invariant(self) -> bool:
        return False

    def _build_cells(self, cells: list[tuple[int, int, float]]) -> None:
        if not cells:
            self.cells = self.row_start = self.row_count = None
            return
        cells.sort(key=lambda cell: cell[0])
        rows, cols, values = zip(*cells)
        self.cells = (
            self._to_device(rows, torch.int64),
            self._to_device(cols, torch.int64),
            self._to_device(values, torch.float32),
        )
        count = [0] * (rows[-1] + 2)
        for row in rows:
            count[row] += 1
        start = [0] * len(count)
        for i in range(1, len(count)):
            start[i] = start[i - 1] + count[i - 1]
        self.row_start = self._to_device(tuple(start), torch.int64)
        self.row_count = self._to_device(tuple(count), torch.int64)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if self.cells is None:
            return logits
        rows, cols, values = self.cells
        return logits.index_put_((rows, cols), values.to(logits.dtype), accumulate=self.accumulate)

    def active_at(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor | None:
        """[R] bool: whether the cells of batch row req[i] apply at position
        pos[i] (req already clamped to the last row_count entry); None: at
        every position."""
        return None

    def apply_at_positions(
        self,
        logits: torch.Tensor,  # [R, vocab], edited in place
        req: torch.Tensor,  # [R] int64: batch row of each logits row
        pos: torch.Tensor,  # [R] int64: tokens past the request's outputs
    ) -> torch.Tensor:
        """`apply` for rows laid out as (request, position) pairs (see the
        module doc): each logits row gets its request's cells where
        `active_at` allows."""
        if self.cells is None or logits.shape[0] == 0:
            return logits
        assert self.row_start is not None and self.row_count is not None
        _, cols, values = self.cells
        req = req.clamp(max=self.row_count.shape[0] - 1)
        reps = self.row_count[req]
        active = self.active_at(req, pos)
        if active is not None:
            reps = torch.where(active, reps, 0)
        total = int(reps.sum())
        if total == 0:
            return logits
        out_rows = torch.repeat_interleave(torch.arange(req.shape[0], device=req.device), reps)
        # Cell k of logits row i: row_start[req[i]] + (k - first k of row i).
        first = torch.repeat_interleave(torch.cumsum(reps, 0) - reps, reps)
        cell = torch.repeat_interleave(self.row_start[req], reps)
        cell = cell + torch.arange(total, device=req.device) - first
        return logits.index_put_(
            (out_rows, cols[cell]), values[cell].to(logits.dtype), accumulate=self.accumulate
        )

    def _to_device(self, data: tuple, dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(data, dtype=dtype, device="cpu", pin_memory=self.pin_memory)
        return t.to(self.device, non_blocking=True)


class LogitBiasLogitsProcessor(SparseCellsLogitsProcessor):
    """Adds each request's `logit_bias` {token: bias} to its row (at every
    position under speculative decoding)."""

    accumulate = True

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


class MinTokensLogitsProcessor(SparseCellsLogitsProcessor):
    """Forbids the stop tokens (EOS, `stop_token_ids` and the generation
    config's extra EOS ids) of a request until it has `min_tokens` outputs
    (under speculative decoding: at the positions p where
    len(outputs) + p < min_tokens)."""

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

    def active_at(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor | None:
        assert self.row_count is not None
        # Outputs still missing per batch row, read now: the lists grew by
        # every token accepted since update_state.
        missing = [0] * self.row_count.shape[0]
        for row, (min_tokens, out, _) in self.min_toks.items():
            if row < len(missing):  # rows past it have no cells
                missing[row] = min_tokens - len(out)
        return pos < torch.tensor(missing, dtype=torch.int64, device=req.device)[req]

    def apply_with_spec_decode(
        self, logits: torch.Tensor, num_draft_tokens: list[int]
    ) -> torch.Tensor:
        """Upstream's entry point: `logits` holds the draft rows only,
        request after request (num_draft_tokens[r] rows for batch row r)."""
        counts = torch.tensor(num_draft_tokens, dtype=torch.int64)
        req = torch.repeat_interleave(torch.arange(len(num_draft_tokens)), counts)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(int(counts.sum())) - starts[req]
        return self.apply_at_positions(logits, req.to(logits.device), pos.to(logits.device))


BUILTIN_LOGITS_PROCESSORS: tuple[type[LogitsProcessor], ...] = (
    MinTokensLogitsProcessor,
    LogitBiasLogitsProcessor,
)
