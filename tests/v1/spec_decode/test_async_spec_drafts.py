"""AsyncSpecDrafts (vllm/v1/worker/async_spec_decode.py), the V1 runner's
state for speculative decoding under async scheduling: the scheduler's
computed-token count is corrected by the previous step's rejected drafts
whether or not the scheduler has processed that step yet; placeholder drafts
become the runner's own (cut to what was scheduled, filled up to k)."""

from __future__ import annotations

import numpy as np
import pytest

from vllm.v1.outputs import DraftTokenIds
from vllm.v1.worker.async_spec_decode import FILLER_DRAFT_TOKEN_ID, AsyncSpecDrafts
from vllm.v1.worker.spec_decode_utils import SpecStep

K = 3


def _state() -> AsyncSpecDrafts:
    """A step of three rows: "a" verified 3 drafts from position 20 and
    emitted 2 tokens (1 accepted, 2 rejected); "b" verified 3 and had all
    accepted; "c" ran a prompt chunk (nothing emitted)."""
    state = AsyncSpecDrafts()
    step = SpecStep(
        metadata=None,
        num_computed_tokens=np.array([20, 30, 0], dtype=np.int32),
        num_scheduled_tokens=np.array([4, 4, 16], dtype=np.int32),
        num_draft_tokens=np.array([3, 3, 0], dtype=np.int32),
    )
    proposed = DraftTokenIds(["a", "b", "c"], [[1, 2, 3], [4], []])
    state.record_step(["a", "b", "c"], step, [[7, 8], [1, 2, 3, 4], []], proposed, K)
    return state


def test_correction_before_and_after_the_scheduler_saw_the_step():
    state = _state()
    # Step not processed yet: the scheduler counts all 3 drafts as accepted.
    assert state.corrected_num_computed("a", 24) == 22
    # Processed already: the scheduler took the 2 rejected back itself.
    assert state.corrected_num_computed("a", 22) == 22
    assert state.corrected_num_computed("b", 34) == 34  # nothing rejected
    assert state.corrected_num_computed("c", 16) == 16
    with pytest.raises(AssertionError, match="neither 24 nor that minus 2"):
        state.corrected_num_computed("a", 23)


def test_placeholders_become_the_runner_drafts():
    state = _state()
    real = state.real_spec_tokens({"a": [-1, -1], "b": [-1, -1, -1], "c": [-1]})
    filler = FILLER_DRAFT_TOKEN_ID
    # "a": cut to the 2 scheduled; "b": its one draft filled up to k; "c":
    # nothing proposed after a prompt chunk.
    assert real == {"a": [1, 2], "b": [4, filler, filler], "c": [filler]}
    drafts = state.draft_token_ids()
    assert dict(zip(drafts.req_ids, drafts.draft_token_ids)) == {
        "a": [1, 2, 3],
        "b": [4, filler, filler],
    }
    state.remove("a")
    assert state.real_spec_tokens({"a": [-1]}) == {"a": [filler]}
    assert state.corrected_num_computed("a", 24) == 24
