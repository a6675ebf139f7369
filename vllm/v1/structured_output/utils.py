"""Helpers of structured outputs: grammar text for choices, Lark detection,
and applying the step's bitmask to the logits (upstream:
vllm/v1/structured_output/utils.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

logger = init_logger(__name__)


class BatchRows(Protocol):
    """What `apply_grammar_bitmask` reads of a runner's input batch: the
    request id of each row, in logits order. V1's `InputBatch` (None marks a
    hole left by a removed request) and Model Runner V2's `InputBatch` both
    provide it."""

    @property
    def req_ids(self) -> Sequence[str | None]: ...


_EBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _ebnf_string(s: str) -> str:
    """`s` as an EBNF string literal (quotes, backslashes, control characters escaped)."""
    out = []
    for ch in s:
        if ch in _EBNF_ESCAPES:
            out.append(_EBNF_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_as_grammar(choice: list[str]) -> str:
    """An EBNF grammar whose language is exactly the given strings."""
    if not choice:
        raise ValueError("choice must be a non-empty list of strings")
    return "root ::= " + " | ".join(_ebnf_string(c) for c in choice)


def grammar_is_likely_lark(grammar_str: str) -> bool:
    """True unless a rule uses EBNF's `::=` (Lark rules use `:`)."""
    for line in grammar_str.split("\n"):
        line = re.sub(r"(#|//).*$", "", line).strip()
        if "::=" in line:
            return False
    return bool(grammar_str.strip())


def apply_grammar_bitmask(
    scheduler_output: SchedulerOutput,
    grammar_output: GrammarOutput,
    input_batch: BatchRows,
    logits: torch.Tensor,
) -> None:
    """Mask, in place, the logits of every structured-output request: a token
    whose bit is clear in its row becomes -inf. Rows of other requests are
    untouched.

    The bitmask's rows follow `grammar_output.structured_output_request_ids`
    (1 + spec tokens rows each); the logits' rows follow `input_batch.req_ids`
    (again 1 + spec tokens each). Ids past the bitmask's vocabulary (padding
    of the logits) are masked too.
    """
    bitmask = grammar_output.grammar_bitmask
    spec = scheduler_output.scheduled_spec_decode_tokens
    # First logits row of each request in the batch.
    logit_row: dict[str, int] = {}
    row = 0
    for req_id in input_batch.req_ids:
        if req_id is None:  # a hole in the V1 batch has no logits row
            continue
        logit_row[req_id] = row
        row += 1 + len(spec.get(req_id, ()))
    # The bitmask re-ordered to the logits' rows; rows without a grammar allow all.
    full = np.full((logits.shape[0], bitmask.shape[1]), -1, dtype=np.int32)
    indices: list[int] = []
    src = 0
    for req_id in grammar_output.structured_output_request_ids:
        n = 1 + len(spec.get(req_id, ()))
        dst = logit_row.get(req_id)
        if dst is not None:  # else: finished/preempted since scheduling
            full[dst : dst + n] = bitmask[src : src + n]
            indices.extend(range(dst, dst + n))
        src += n
    if not indices:
        return
    _apply(logits, torch.from_numpy(full), indices)


def _apply(logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int]) -> None:
    import xgrammar as xgr

    width = bitmask.shape[1] * 32
    vocab = min(width, logits.shape[-1])
    if logits.device.type == "cpu":
        from vllm import _custom_ops as ops

        # The compiled op (csrc/cpu/bitmask.cpp) also masks the padded ids.
        if ops.apply_token_bitmask(logits, bitmask, torch.tensor(indices, dtype=torch.int64)):
            return
    bitmask = bitmask.to(logits.device, non_blocking=True)
    done = False
    if logits.is_contiguous() and logits.dtype in (torch.float32, torch.float16, torch.bfloat16):
        try:
            # CPU: xgrammar's C++ loop; CUDA: its Triton kernel.
            xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab, indices=indices)
            done = True
        except (ImportError, RuntimeError) as e:
            # No Triton (or its kernel failed to build) on this device: the
            # torch ops below do the same (masking twice changes nothing).
            logger.warning_once(
                "xgrammar's bitmask kernel is unavailable (%s); using torch ops.", e
            )
    if not done:
        _apply_torch(logits, bitmask, indices, vocab)
    if logits.shape[-1] > width:
        # Padded vocabulary: ids the grammar never sees are never allowed.
        rows = torch.tensor(indices, device=logits.device)
        logits[rows, width:] = float("-inf")


def _apply_torch(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: list[int], vocab: int
) -> None:
    """The same masking with plain torch ops (any dtype/layout)."""
    rows = torch.tensor(indices, device=logits.device)
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    # [n, words, 32] -> [n, words * 32]: bit j of word w is token 32 * w + j.
    allowed = ((bitmask[rows].unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]
    sub = logits[rows, :vocab]
    logits[rows, :vocab] = sub.masked_fill(~allowed, float("-inf"))
