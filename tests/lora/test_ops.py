"""The PyTorch multi-LoRA ops (vllm/lora/ops/torch_ops) against a dense
per-token float64 reference: several adapters interleaved with base tokens,
ranks 8 and 16, float32 and bfloat16 (tolerances in lora_ref.TOL)."""

import pytest
import torch

from tests.lora.lora_ref import TOL, ref_lora, ref_shrink, stacked
from vllm.lora.ops.torch_ops import (
    bgmv_expand,
    bgmv_expand_slice,
    bgmv_shrink,
    sgmv_expand,
    sgmv_expand_slice,
    sgmv_shrink,
)
from vllm.lora.punica_wrapper.utils import compute_meta

HIDDEN, OUT, NUM_LORAS = 64, 48, 4
# Interleaved slots (the index_select path), a contiguous run (the slice
# path) and base tokens (-1) in between.
SLOTS = [0, 2, -1, 2, 3, 3, 3, -1, 1, 0, 0, 2, -1, -1, 3, 1]


def _x(dtype: torch.dtype, n: int = len(SLOTS)) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16])
def test_bgmv_shrink(dtype, rank):
    x, a = _x(dtype), stacked(NUM_LORAS, rank, HIDDEN, dtype, seed=2)
    out = torch.full((len(SLOTS), rank), 7.0)  # float32 buffer, as the wrapper's
    bgmv_shrink(x, a, out, torch.tensor(SLOTS), 0.5)
    torch.testing.assert_close(out.double(), ref_shrink(x, a, SLOTS, 0.5), atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16])
@pytest.mark.parametrize("add_inputs", [True, False])
def test_bgmv_expand_leaves_base_rows(dtype, rank, add_inputs):
    buf = torch.randn(len(SLOTS), rank, generator=torch.Generator().manual_seed(3))
    b = stacked(NUM_LORAS, OUT, rank, dtype, seed=4)
    y0 = torch.randn(len(SLOTS), OUT, generator=torch.Generator().manual_seed(5)).to(dtype)
    y = y0.clone()
    bgmv_expand(buf, b, y, torch.tensor(SLOTS), add_inputs=add_inputs)
    eye = torch.eye(rank).reshape(1, 1, rank, rank).expand(NUM_LORAS, 1, rank, rank)
    start = y0 if add_inputs else torch.where(torch.tensor(SLOTS)[:, None] >= 0, 0, y0)
    want = ref_lora(start, buf, [eye], [b], SLOTS, 1.0)
    torch.testing.assert_close(y.double(), want, atol=TOL[dtype], rtol=0)
    base = torch.tensor(SLOTS) < 0
    assert torch.equal(y[base], y0[base])  # bit-exact: never written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bgmv_expand_slice_multi_slice(dtype):
    # Merged QKV-like output: three slices of different widths side by side.
    rank, widths = 16, (32, 16, 16)
    buf = torch.randn(len(SLOTS), rank, generator=torch.Generator().manual_seed(6))
    bs = [stacked(NUM_LORAS, w, rank, dtype, seed=10 + i) for i, w in enumerate(widths)]
    y = torch.zeros(len(SLOTS), sum(widths), dtype=dtype)
    off = 0
    for b, w in zip(bs, widths):
        bgmv_expand_slice(buf, b, y, torch.tensor(SLOTS), off, w, add_inputs=True)
        off += w
    eye = torch.eye(rank).reshape(1, 1, rank, rank).expand(NUM_LORAS, 1, rank, rank)
    want = ref_lora(torch.zeros_like(y), buf, [eye] * 3, bs, SLOTS, 1.0)
    torch.testing.assert_close(y.double(), want, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sgmv_shrink_expand_equal_full_lora(dtype):
    # Prefill layout: runs of tokens per request, adapters repeated across runs.
    slots = [1] * 5 + [-1] * 3 + [0] * 4 + [1] * 2 + [3] * 6
    starts, lens, seg_slots, batches, max_len, tokens, no_lora = compute_meta(torch.tensor(slots))
    assert (batches, max_len, tokens, no_lora) == (5, 6, 20, False)
    meta = (starts, lens, seg_slots, batches, max_len, tokens)
    x = _x(dtype, len(slots))
    a, b = stacked(NUM_LORAS, 8, HIDDEN, dtype, 20), stacked(NUM_LORAS, OUT, 8, dtype, 21)
    b2 = stacked(NUM_LORAS, 16, 8, dtype, 22)
    buf = torch.zeros(len(slots), 8)
    sgmv_shrink(x, a, buf, *meta, 2.0)
    y = torch.ones(len(slots), OUT + 16, dtype=dtype)
    sgmv_expand(buf, b, y, *meta, add_inputs=True)
    sgmv_expand_slice(buf, b2, y, *meta, OUT, 16, add_inputs=True)
    want = ref_lora(torch.ones_like(y), x, [a, a], [b, b2], slots, 2.0)
    torch.testing.assert_close(y.double(), want, atol=TOL[dtype], rtol=0)


def test_expand_pads_to_common_width():
    # Adapter B wider than the output (upstream: adapter and model padding
    # differ): only the common columns are written.
    b = stacked(2, 40, 8, torch.float32, 30)
    buf = torch.randn(3, 8)
    y = torch.zeros(3, 32)
    bgmv_expand(buf, b, y, torch.tensor([1, 0, 1]), add_inputs=False)
    want = torch.stack([b[s, 0, :32] @ buf[t] for t, s in enumerate([1, 0, 1])])
    torch.testing.assert_close(y, want)


def test_row_count_mismatch_is_refused():
    with pytest.raises(ValueError, match="rows"):
        bgmv_shrink(torch.zeros(3, 8), torch.zeros(1, 4, 8), torch.zeros(3, 4), torch.zeros(2))
