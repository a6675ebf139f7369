"""PunicaWrapperCPU driven through update_metadata (LoRA ids -> slots) against
the dense float64 reference: merged-QKV linear (3 slices), embedding, logits,
prefill and decode, base tokens untouched; and the platform selector."""

import pytest
import torch

from tests.lora.lora_ref import TOL, ref_lora, stacked
from vllm.lora.layers import LoRAMapping
from vllm.lora.punica_wrapper import PunicaWrapperBase, get_punica_wrapper
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

HIDDEN, MAX_LORAS, VOCAB = 64, 4, 100
# Slot s holds LoRA id LORA_IDS[s]; slot 2 is free.
LORA_IDS: list[int | None] = [7, 3, None, 11]
# Per-token LoRA ids (0 = base): three requests, one without an adapter.
TOKEN_IDS = [3] * 5 + [0] * 4 + [11] * 3 + [7] * 4
ID_TO_SLOT = {7: 0, 3: 1, 11: 3, 0: -1}


def _wrapper(prefill: bool, token_ids: list[int] = TOKEN_IDS) -> PunicaWrapperCPU:
    w = PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=8, device="cpu")
    mapping = LoRAMapping(tuple(token_ids), tuple(token_ids), is_prefill=prefill)
    w.update_metadata(mapping, LORA_IDS, MAX_LORAS, VOCAB)
    return w


def _slots(token_ids: list[int] = TOKEN_IDS) -> list[int]:
    return [ID_TO_SLOT[i] for i in token_ids]


def test_metadata_from_mapping():
    w = _wrapper(prefill=True)
    assert w.token_lora_indices.tolist() == _slots()
    starts, lens, slots, batches, max_len, tokens = w.prefill_metadata
    assert (starts.tolist(), lens.tolist(), slots.tolist()) == (
        [0, 5, 9, 12],
        [5, 4, 3, 4],
        [1, -1, 3, 0],
    )
    assert (batches, max_len, tokens, w.no_lora) == (4, 5, 16, False)
    # Padded sampler rows: row r of slot s (-1 -> max_loras - 1) -> r + s * rows.
    n = len(TOKEN_IDS)
    want = [r + (s if s >= 0 else MAX_LORAS - 1) * n for r, s in enumerate(_slots())]
    assert w.sampler_indices_padded.tolist() == want


def test_unknown_lora_id_is_refused():
    w = PunicaWrapperCPU(8, 4, "cpu")
    with pytest.raises(ValueError, match="LoRA id 5"):
        w.update_metadata(LoRAMapping((5,), (5,)), LORA_IDS, MAX_LORAS, VOCAB)


@pytest.mark.parametrize("prefill", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16])
def test_add_lora_linear_qkv(prefill, dtype, rank):
    slices = (32, 16, 16)  # q, k, v widths
    a = tuple(stacked(MAX_LORAS, rank, HIDDEN, dtype, 40 + i) for i in range(3))
    b = tuple(stacked(MAX_LORAS, n, rank, dtype, 50 + i) for i, n in enumerate(slices))
    x = torch.randn(len(TOKEN_IDS), HIDDEN, generator=torch.Generator().manual_seed(0)).to(dtype)
    y0 = torch.randn(len(TOKEN_IDS), sum(slices), generator=torch.Generator().manual_seed(1))
    y0 = y0.to(dtype)
    y = y0.clone()
    _wrapper(prefill).add_lora_linear(y, x, a, b, 0.25, slices)
    want = ref_lora(y0, x, list(a), list(b), _slots(), 0.25)
    torch.testing.assert_close(y.double(), want, atol=TOL[dtype], rtol=0)
    base = torch.tensor(_slots()) < 0
    assert torch.equal(y[base], y0[base])


@pytest.mark.parametrize("prefill", [True, False])
def test_all_base_batch_changes_nothing(prefill):
    a, b = (
        (stacked(MAX_LORAS, 8, HIDDEN, torch.float32, 60),),
        (stacked(MAX_LORAS, 24, 8, torch.float32, 61),),
    )
    y0 = torch.randn(6, 24)
    y = y0.clone()
    w = _wrapper(prefill, [0] * 6)
    assert w.no_lora == prefill
    w.add_lora_linear(y, torch.randn(6, HIDDEN), a, b, 1.0, (24,))
    assert torch.equal(y, y0)


@pytest.mark.parametrize("prefill", [True, False])
def test_add_lora_embedding(prefill):
    # Embedding LoRA: x = the adapter's A rows already looked up, expand only.
    rank = 16
    b = stacked(MAX_LORAS, HIDDEN, rank, torch.float32, 70)
    x = torch.randn(len(TOKEN_IDS), rank)
    y0 = torch.randn(len(TOKEN_IDS), HIDDEN)
    y = y0.clone()
    _wrapper(prefill).add_lora_embedding(y, x, b)
    eye = torch.eye(rank).reshape(1, 1, rank, rank).expand(MAX_LORAS, 1, rank, rank)
    torch.testing.assert_close(
        y.double(), ref_lora(y0, x, [eye], [b], _slots(), 1.0), atol=1e-4, rtol=0
    )


def test_add_lora_logits_uses_sampler_rows():
    # Decode-style: one sampled row per request, keyed by prompt_mapping.
    ids = [11, 0, 3]
    w = PunicaWrapperCPU(16, 4, "cpu")
    w.update_metadata(LoRAMapping(tuple(TOKEN_IDS), tuple(ids)), LORA_IDS, MAX_LORAS, VOCAB)
    a, b = (
        stacked(MAX_LORAS, 8, HIDDEN, torch.float32, 80),
        stacked(MAX_LORAS, VOCAB, 8, torch.float32, 81),
    )
    x = torch.randn(3, HIDDEN)
    y0 = torch.randn(3, VOCAB)
    y = y0.clone()
    w.add_lora_logits(y, x, a, b, 0.5)
    want = ref_lora(y0, x, [a], [b], [ID_TO_SLOT[i] for i in ids], 0.5)
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=0)


def test_selector_gives_cpu_wrapper():
    w = get_punica_wrapper(32, 4, device="cpu")
    assert isinstance(w, PunicaWrapperCPU) and isinstance(w, PunicaWrapperBase)
    with pytest.raises(TypeError):
        PunicaWrapperBase(32, 4, "cpu")  # type: ignore[abstract]


# One step's plan per layout (vllm/lora/ops/torch_ops/lora_plan.py): 8 slots,
# LoRA id 100 + s in slot s. "runs": long runs of one slot (prefill) -> one
# slice per run; "dense": short runs over a narrow slot span (decode) -> the
# masked all-slot matmuls; "gather": short runs over a wide span -> per-slot
# index rows.
WIDE_IDS: list[int | None] = [100 + s for s in range(8)]
LAYOUTS = {
    "runs": [101] * 100 + [0] * 60 + [103] * 70 + [101] * 50,
    "dense": [101, 103, 0, 102, 101, 101, 0, 103, 102, 101],
    # Every slot in use: the slices' A also go through one stacked matmul.
    "dense-all": [100, 107, 101, 0, 106, 102, 105, 103, 104, 100, 0, 107, 103],
    "gather": [100, 107, 0, 107, 100, 100, 107, 0, 100, 107, 107, 100],
    # Long runs alternating between adapters (an unsorted prefill batch).
    "gather-prefill": ([101] * 40 + [102] * 40 + [0] * 20) * 3,
}


def _plan_kind(w: PunicaWrapperCPU) -> str:
    if w.plan.dense:
        return "dense"
    return "runs" if all(isinstance(r, slice) for _, r in w.plan.items) else "gather"


def _wide(layout: str) -> tuple[PunicaWrapperCPU, list[int]]:
    ids = LAYOUTS[layout]
    w = PunicaWrapperCPU(max_num_batched_tokens=512, max_batches=64, device="cpu")
    w.update_metadata(LoRAMapping(tuple(ids), tuple(ids), is_prefill=True), WIDE_IDS, 8, VOCAB)
    assert _plan_kind(w) == layout.split("-")[0]
    return w, [i - 100 if i else -1 for i in ids]


def _gate_up(dtype: torch.dtype, rank: int) -> tuple[tuple, tuple, tuple[int, ...]]:
    slices = (40, 40)
    a = tuple(stacked(8, rank, HIDDEN, dtype, 90 + i) for i in range(2))
    b = tuple(stacked(8, n, rank, dtype, 95 + i) for i, n in enumerate(slices))
    return a, b, slices


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [8, 16])
def test_plans_linear_and_shrink_expand(layout, dtype, rank):
    """add_lora_linear and add_shrink + add_expand (the row-parallel layer's
    calls) give the reference in every plan, base rows bit-exact."""
    w, slots = _wide(layout)
    a, b, slices = _gate_up(dtype, rank)
    n = len(slots)
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(3)).to(dtype)
    y0 = torch.randn(n, 5 + sum(slices), generator=torch.Generator().manual_seed(4)).to(dtype)
    want = ref_lora(y0, x, list(a), list(b), slots, 0.5, offset=5)
    base = torch.tensor(slots) < 0
    y = y0.clone()
    w.add_lora_linear(y[:, 5:], x, a, b, 0.5, slices)
    torch.testing.assert_close(y.double(), want, atol=TOL[dtype], rtol=0)
    assert torch.equal(y[base], y0[base])
    buf = torch.full((2, n, rank), 9.0)  # float32, stale values to overwrite
    w.add_shrink(buf, x, a, 0.5)
    assert torch.equal(buf[:, base], torch.zeros_like(buf[:, base]))
    y = y0.clone()
    w.add_expand(y, buf, b, slices, offset_start=5)
    torch.testing.assert_close(y.double(), want, atol=TOL[dtype], rtol=0)
    assert torch.equal(y[base], y0[base])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_plans_overwrite_expand(layout):
    """add_inputs=False writes adapted rows and leaves base rows alone."""
    w, slots = _wide(layout)
    a, b, slices = _gate_up(torch.float32, 8)
    x = torch.randn(len(slots), HIDDEN)
    y0 = torch.randn(len(slots), sum(slices))
    y = y0.clone()
    w.add_lora_linear(y, x, a, b, 1.0, slices, add_inputs=False)
    want = ref_lora(torch.zeros_like(y0), x, list(a), list(b), slots, 1.0)
    base = torch.tensor(slots) < 0
    torch.testing.assert_close(y[~base].double(), want[~base], atol=1e-4, rtol=0)
    assert torch.equal(y[base], y0[base])


@pytest.mark.parametrize("layout", ["dense", "dense-all"])
@pytest.mark.parametrize("inference", [False, True])
def test_dense_b_cache_follows_new_weights(inference, layout):
    """The dense plan's cached B layout is rebuilt when a slot's B is
    rewritten in place (seen by the version counter, same slot table) or,
    for inference-mode tensors (no version counter), when the slot table
    changes (a new adapter id in slot 3)."""
    w, slots = _wide(layout)
    ids, table = list(LAYOUTS[layout]), list(WIDE_IDS)
    with torch.inference_mode(inference):
        a, b, slices = _gate_up(torch.float32, 8)
        x, y0 = torch.randn(len(slots), HIDDEN), torch.randn(len(slots), sum(slices))
        w.add_lora_linear(y0.clone(), x, a, b, 1.0, slices)  # fills the cache
        for s in (0, 1):  # new A and B weights in slot 3
            a[s][3].copy_(stacked(1, 8, HIDDEN, torch.float32, 72 + s)[0])
            b[s][3].copy_(stacked(1, slices[s], 8, torch.float32, 70 + s)[0])
        if inference:
            table[3] = 200
            ids = [200 if i == 103 else i for i in ids]
        w.update_metadata(LoRAMapping(tuple(ids), tuple(ids), True), table, 8, VOCAB)
        y = y0.clone()
        w.add_lora_linear(y, x, a, b, 1.0, slices)
    want = ref_lora(y0, x, list(a), list(b), slots, 1.0)
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", ["runs", "dense"])
def test_logits_plan_from_sampler_rows(layout):
    """Logits LoRA on the sampled rows, whatever plan the tokens get."""
    w, _ = _wide(layout)
    sampled = [103, 0, 101, 101, 102]
    w.update_metadata(
        LoRAMapping(tuple(LAYOUTS[layout]), tuple(sampled), is_prefill=True), WIDE_IDS, 8, VOCAB
    )
    a, b = stacked(8, 8, HIDDEN, torch.float32, 5), stacked(8, VOCAB, 8, torch.float32, 6)
    x, y0 = torch.randn(len(sampled), HIDDEN), torch.randn(len(sampled), VOCAB)
    y = y0.clone()
    w.add_lora_logits(y, x, a, b, 1.0)
    slots = [i - 100 if i else -1 for i in sampled]
    torch.testing.assert_close(y.double(), ref_lora(y0, x, [a], [b], slots, 1.0), atol=1e-4, rtol=0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_plans_float32_lora_on_bfloat16_layer(layout):
    """lora_dtype float32 under a bfloat16 model: the bf16 activations are
    cast to the weights' dtype and the delta is added into the bf16 output."""
    w, slots = _wide(layout)
    a, b, slices = _gate_up(torch.float32, 16)
    x = torch.randn(len(slots), HIDDEN).to(torch.bfloat16)
    y0 = torch.randn(len(slots), sum(slices)).to(torch.bfloat16)
    y = y0.clone()
    w.add_lora_linear(y, x, a, b, 1.0, slices)
    want = ref_lora(y0, x, list(a), list(b), slots, 1.0)
    torch.testing.assert_close(y.double(), want, atol=TOL[torch.bfloat16], rtol=0)
    base = torch.tensor(slots) < 0
    assert torch.equal(y[base], y0[base])


@pytest.mark.parametrize("inference", [False, True])
def test_module_without_adapter_weights_is_skipped_until_written(inference):
    """An all-zero B stack (no loaded adapter targets the module, e.g. the LM
    head) leaves y bit-exact; once a slot gets weights (in-place write, or a
    new id in the slot table for inference-mode tensors) the delta applies."""
    w, slots = _wide("dense")
    ids, table = list(LAYOUTS["dense"]), list(WIDE_IDS)
    with torch.inference_mode(inference):
        a = stacked(8, 8, HIDDEN, torch.float32, 11)
        b = torch.zeros(8, 1, VOCAB, 8)
        x, y0 = torch.randn(len(slots), HIDDEN), torch.randn(len(slots), VOCAB)
        y = y0.clone()
        w.add_lora_linear(y, x, (a,), (b,), 1.0, (VOCAB,))
        assert torch.equal(y, y0)
        b[1].copy_(stacked(1, VOCAB, 8, torch.float32, 12)[0])  # slot 1 gets weights
        if inference:
            table[1], ids = 300, [300 if i == 101 else i for i in ids]
        w.update_metadata(LoRAMapping(tuple(ids), tuple(ids), True), table, 8, VOCAB)
        w.add_lora_linear(y, x, (a,), (b,), 1.0, (VOCAB,))
    want = ref_lora(y0, x, [a], [b], slots, 1.0)
    torch.testing.assert_close(y.double(), want, atol=1e-4, rtol=0)
    assert not torch.equal(y, y0)
