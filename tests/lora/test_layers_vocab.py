"""The LoRA embedding and LM-head layers against a dense float64 per-token
reference built from the adapters' own peft tensors: the embedding looks up
A's column per token id (peft's lora_embedding_A [r, vocab]) and expands it
with B [hidden, r]; the LM head adds h @ A.T @ B.T to the raw logits, before
soft-cap and scale, keyed per token when there is one row per token and per
sampled row otherwise. Same slots and mapping as tests/lora/test_layers.py."""

from __future__ import annotations

import pytest
import torch

from tests.lora.lora_ref import TOL
from tests.lora.test_layers import (
    LORA_IDS,
    MAX_LORAS,
    RANKS,
    TOKEN_IDS,
    _lora_config,
    _randn,
    make_wrapper,
)
from vllm.lora.layers import LogitsProcessorWithLoRA, VocabParallelEmbeddingWithLoRA
from vllm.lora.punica_wrapper import PunicaWrapperBase
from vllm.lora.utils import from_layer, from_layer_logits_processor
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)

VOCAB, DIM = 100, 64
# LoRA ids of the sampled rows (one per request), for the sampler-rows case.
SAMPLED_IDS = (1, 0, 2, 3, 2)


def _table(seed: int, dtype: torch.dtype, cls: type = VocabParallelEmbedding) -> torch.nn.Module:
    layer = cls(VOCAB, DIM, params_dtype=dtype)
    full = _randn(seed, VOCAB, DIM).to(dtype)
    layer.weight.weight_loader(layer.weight, full)
    layer.process_weights_after_loading(dtype)
    return layer


def _embedding_adapter(lora_id: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """peft's lora_embedding_A [r, vocab] and lora_embedding_B [dim, r] (scaled)."""
    r = RANKS[lora_id]
    a = _randn(2000 + lora_id, r, VOCAB).to(dtype)
    return a, _randn(2100 + lora_id, DIM, r, scale=0.5 * r**-0.5).to(dtype)


def _head_adapter(lora_id: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """lm_head's lora_A [r, hidden] and lora_B [vocab, r] (scaled)."""
    r = RANKS[lora_id]
    a = _randn(3000 + lora_id, r, DIM, scale=DIM**-0.5).to(dtype)
    return a, _randn(3100 + lora_id, VOCAB, r, scale=r**-0.5).to(dtype)


def _punica(prefill: bool, sampled: tuple[int, ...] = tuple(TOKEN_IDS)) -> PunicaWrapperBase:
    return make_wrapper(tuple(TOKEN_IDS), sampled, prefill, VOCAB)


def _load(layer, adapter) -> None:
    for slot, lora_id in enumerate(LORA_IDS):
        if lora_id is not None:
            layer.set_lora(slot, *adapter(lora_id, layer.lora_b_stacked.dtype))


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (len(TOKEN_IDS),), generator=torch.Generator().manual_seed(3))


def embedding_with_lora(dtype: torch.dtype, prefill: bool) -> VocabParallelEmbeddingWithLoRA:
    """The embedding wrapped by from_layer, adapters 1-3 loaded, mapping set."""
    layer = from_layer(_table(200, dtype), MAX_LORAS, _lora_config(dtype), [])
    assert isinstance(layer, VocabParallelEmbeddingWithLoRA)
    _load(layer, _embedding_adapter)
    layer.set_mapping(_punica(prefill))
    return layer


def head_with_lora(
    dtype: torch.dtype, sampled: tuple[int, ...] = tuple(TOKEN_IDS), prefill: bool = True
) -> tuple[LogitsProcessorWithLoRA, ParallelLMHead]:
    """(the processor wrapped, soft-cap 30 and scale 0.5; its LM head)."""
    head = _table(300, dtype, ParallelLMHead)
    base = LogitsProcessor(VOCAB, scale=0.5, soft_cap=30.0)
    layer = from_layer_logits_processor(base, head, MAX_LORAS, _lora_config(dtype))
    _load(layer, _head_adapter)
    layer.set_mapping(_punica(prefill, sampled))
    return layer, head


def _embedding_reference(ids: torch.Tensor, base_out: torch.Tensor) -> torch.Tensor:
    out = base_out.double().clone()
    for t, lora_id in enumerate(TOKEN_IDS):
        if lora_id:
            a, b = _embedding_adapter(lora_id, base_out.dtype)
            out[t] += a[:, ids[t]].double() @ b.double().t()
    return out


def _head_reference(
    hidden: torch.Tensor, raw: torch.Tensor, ids: tuple[int, ...] | list[int]
) -> torch.Tensor:
    """(raw logits + per-row LoRA), then soft-cap 30 and scale 0.5, float64."""
    out = raw.double().clone()
    for t, lora_id in enumerate(ids):
        if lora_id:
            a, b = _head_adapter(lora_id, hidden.dtype)
            out[t] += (hidden[t].double() @ a.double().t()) @ b.double().t()
    return torch.tanh(out / 30.0) * 30.0 * 0.5


def test_from_layer_wraps_the_embedding_not_the_head():
    config = _lora_config(torch.float32)
    head = ParallelLMHead(VOCAB, DIM)
    assert from_layer(head, 2, config, []) is head
    layer = from_layer(VocabParallelEmbedding(VOCAB, DIM), 2, config, [])
    assert type(layer) is VocabParallelEmbeddingWithLoRA
    assert layer.lora_a_stacked.shape == (2, VOCAB, 16)
    assert layer.lora_b_stacked.shape == (2, 1, DIM, 16)


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_embedding(dtype, prefill):
    layer = embedding_with_lora(dtype, prefill)
    ids = _ids()
    base_out = layer.base_layer(ids)
    out = layer(ids)
    want = _embedding_reference(ids, base_out)
    torch.testing.assert_close(out.double(), want, atol=TOL[dtype], rtol=0)
    base_rows = torch.tensor(TOKEN_IDS) == 0
    assert torch.equal(out[base_rows], base_out[base_rows])
    assert (want - base_out.double())[~base_rows].abs().max() > 0.3
    for slot in range(MAX_LORAS):
        layer.reset_lora(slot)
    assert torch.equal(layer(ids), base_out)


def test_embedding_refuses_a_vocabulary_mismatch():
    layer = embedding_with_lora(torch.float32, True)
    with pytest.raises(ValueError, match=r"lora_a of shape \(8, 101\)"):
        layer.set_lora(0, torch.zeros(8, VOCAB + 1), torch.zeros(DIM, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_logits_one_row_per_token(dtype):
    # The sampled rows map differently: the per-token slots must be the ones used.
    layer, head = head_with_lora(dtype, SAMPLED_IDS)
    hidden = _randn(5, len(TOKEN_IDS), DIM).to(dtype)
    raw = LogitsProcessor(VOCAB)(head, hidden)
    out = layer(head, hidden)
    assert out.shape == (len(TOKEN_IDS), VOCAB) and out.dtype == dtype
    want = _head_reference(hidden, raw, TOKEN_IDS)
    # bf16: logits of magnitude ~10 before the cap (2^-8 relative rounding).
    torch.testing.assert_close(out.double(), want, atol=TOL[dtype] * 2, rtol=0)
    base_rows = torch.tensor(TOKEN_IDS) == 0
    assert torch.equal(
        out[base_rows], LogitsProcessor(VOCAB, scale=0.5, soft_cap=30.0)(head, hidden)[base_rows]
    )


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
def test_logits_sampled_rows(prefill):
    layer, head = head_with_lora(torch.float32, SAMPLED_IDS, prefill)
    hidden = _randn(6, len(SAMPLED_IDS), DIM)
    raw = LogitsProcessor(VOCAB)(head, hidden)
    want = _head_reference(hidden, raw, SAMPLED_IDS)
    torch.testing.assert_close(layer(head, hidden).double(), want, atol=TOL[torch.float32], rtol=0)


def test_logits_other_row_count_is_an_internal_error():
    layer, head = head_with_lora(torch.float32, SAMPLED_IDS)
    with pytest.raises(AssertionError, match="3 hidden-state rows"):
        layer(head, torch.zeros(3, DIM))


def test_logits_reset_and_refusals():
    layer, head = head_with_lora(torch.float32)
    hidden = _randn(5, len(TOKEN_IDS), DIM)
    for slot in range(MAX_LORAS):
        layer.reset_lora(slot)
    base = LogitsProcessor(VOCAB, scale=0.5, soft_cap=30.0)
    assert torch.equal(layer(head, hidden), base(head, hidden))
    with pytest.raises(ValueError, match=r"lora_b of shape \(99, 8\)"):
        layer.set_lora(0, torch.zeros(8, DIM), torch.zeros(VOCAB - 1, 8))
    with pytest.raises(ValueError, match="vocab size must be <= 258048"):
        from_layer_logits_processor(LogitsProcessor(258049), head, 1, _lora_config(torch.float32))
