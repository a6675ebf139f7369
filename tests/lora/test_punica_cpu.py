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
