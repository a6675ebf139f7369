"""The compiled grammar-mask op (csrc/cpu/bitmask.cpp) against xgrammar's
own CPU kernel: every shape edge (vocab not a multiple of 32 or 16, bitmask
narrower than the logits: padded ids), fp32 and bf16, a subset of rows, and
all-allowed words (the op's skip path)."""

from __future__ import annotations

import pytest
import torch

from vllm import _custom_ops as ops

pytestmark = pytest.mark.skipif(
    not ops.cpu_ops_available(), reason=f"vllm._C not loaded: {ops.cpu_ops_load_error()}"
)

SHAPES = [(32, 32000, 1000), (5, 100, 4), (7, 96, 3), (3, 33, 2), (4, 64, 1), (2, 1, 1), (6, 50, 2)]


def _reference(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    xgr = pytest.importorskip("xgrammar")
    out = logits.float().clone()
    width = bitmask.shape[1] * 32
    vocab = min(width, logits.shape[1])
    xgr.apply_token_bitmask_inplace(out, bitmask, vocab_size=vocab, indices=rows)
    out[rows, width:] = float("-inf")  # ids the grammar never saw
    return out.to(logits.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,vocab,words", SHAPES)
def test_matches_xgrammar(dtype, n, vocab, words):
    g = torch.Generator().manual_seed(n * 1000 + vocab)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (n, words), dtype=torch.int32, generator=g)
    bitmask[0] = -1  # every token allowed
    if n > 2:
        bitmask[2, 0] = 0  # a word with no token allowed
    logits = torch.randn(n, vocab, generator=g).to(dtype)
    rows = [r for r in range(n) if r != 1]  # row 1 has no grammar: untouched
    got = logits.clone()
    assert ops.apply_token_bitmask(got, bitmask, torch.tensor(rows, dtype=torch.int64))
    torch.testing.assert_close(got, _reference(logits, bitmask, rows), rtol=0, atol=0)
    if n > 1:
        assert torch.equal(got[1], logits[1])


def test_refuses_what_it_cannot_take():
    logits = torch.randn(4, 64)
    bitmask = torch.full((4, 2), -1, dtype=torch.int32)
    rows = torch.tensor([0], dtype=torch.int64)
    # Not the compiled op's job: the caller falls back to xgrammar's kernel.
    assert not ops.apply_token_bitmask(logits.double(), bitmask, rows)
    assert not ops.apply_token_bitmask(logits, bitmask[:3], rows)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.apply_token_bitmask(logits, bitmask, torch.tensor([4], dtype=torch.int64))
