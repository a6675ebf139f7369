"""Checks of the Triton LoRA kernels and PunicaWrapperGPU on CPU tensors under
TRITON_INTERPRET=1, against the dense float64 reference (tests/lora/lora_ref.py).

Triton reads TRITON_INTERPRET when a kernel is decorated (module import), so
the checks run in a fresh interpreter: `python -m tests.lora.triton_checks`
prints one JSON verdict per check (test_ops_triton.py runs it).
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable

import torch

from tests.lora.lora_ref import TOL, ref_lora, ref_shrink, stacked
from vllm.config import LoRAConfig
from vllm.lora.layers import LoRAMapping
from vllm.lora.ops.triton_ops import LoRAKernelMeta, lora_expand, lora_shrink
from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

CHECKS: dict[str, Callable[[], None]] = {}
HIDDEN, MAX_LORAS, VOCAB = 64, 4, 40
LORA_IDS: list[int | None] = [7, 3, None, 11]
ID_TO_SLOT = {7: 0, 3: 1, 11: 3, 0: -1}
# Interleaved (decode-like) LoRA ids, base tokens (0) among them; id 3 has
# 17 tokens, so its group spans two 16-row tiles.
TOKEN_IDS = [3, 11, 0, 3, 7, 7, 11, 0, 3, 3, 3, 7, 11, 11, 0, 3, 3, 3, 3, 7] + [3] * 8
SLOTS = [ID_TO_SLOT[i] for i in TOKEN_IDS]


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    err = (got.double() - want).abs().max().item()
    assert err <= TOL[dtype], f"max abs error {err} > {TOL[dtype]} ({dtype})"


def _wrapper(token_ids: list[int], prompt_ids: list[int] | None = None) -> PunicaWrapperGPU:
    w = PunicaWrapperGPU(64, 8, "cpu", max_loras=MAX_LORAS)
    mapping = LoRAMapping(tuple(token_ids), tuple(prompt_ids or token_ids), is_prefill=False)
    w.update_metadata(mapping, LORA_IDS, MAX_LORAS, VOCAB)
    return w


def _qkv(dtype: torch.dtype, rank: int) -> None:
    slices = (32, 16, 16)
    a = tuple(stacked(MAX_LORAS, rank, HIDDEN, dtype, 40 + i) for i in range(3))
    b = tuple(stacked(MAX_LORAS, n, rank, dtype, 50 + i) for i, n in enumerate(slices))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(SLOTS), HIDDEN, generator=g).to(dtype)
    y0 = torch.randn(len(SLOTS), sum(slices), generator=g).to(dtype)
    y = y0.clone()
    _wrapper(TOKEN_IDS).add_lora_linear(y, x, a, b, 0.25, slices)
    _close(y, ref_lora(y0, x, list(a), list(b), SLOTS, 0.25), dtype)
    base = torch.tensor(SLOTS) < 0
    assert torch.equal(y[base], y0[base]), "a base token's row changed"


@check
def check_linear_qkv_fp32_rank8() -> None:
    _qkv(torch.float32, 8)


@check
def check_linear_qkv_bf16_rank16() -> None:
    _qkv(torch.bfloat16, 16)


@check
def check_shrink_and_expand_ops() -> None:
    # The raw ops with LoRAKernelMeta; expand at an offset with add_inputs=False.
    meta = LoRAKernelMeta.make(MAX_LORAS, 64, "cpu")
    meta.prepare_tensors(torch.tensor(SLOTS))
    args = meta.meta_args(len(SLOTS), False)
    x = torch.randn(len(SLOTS), HIDDEN)
    a = stacked(MAX_LORAS, 16, HIDDEN, torch.float32, 1)
    buf = torch.full((1, len(SLOTS), 16), 9.0)
    lora_shrink(x, [a], buf, *args, 0.5)
    _close(buf[0], ref_shrink(x, a, SLOTS, 0.5), torch.float32)
    b = stacked(MAX_LORAS, 24, 16, torch.float32, 2)
    y = torch.full((len(SLOTS), 32), 5.0)
    lora_expand(buf, [b], y, *args, offset_start=8, add_inputs=False)
    eye = torch.eye(16).reshape(1, 1, 16, 16).expand(MAX_LORAS, 1, 16, 16)
    want = ref_lora(
        torch.where(torch.tensor(SLOTS)[:, None] >= 0, 0.0, y.new_full(y.shape, 5.0)),
        buf[0],
        [eye],
        [b],
        SLOTS,
        1.0,
        offset=8,
    )
    want[:, :8] = 5.0
    _close(y, want, torch.float32)


@check
def check_metadata() -> None:
    meta = LoRAKernelMeta.make(MAX_LORAS, 64, "cpu")
    meta.prepare_tensors(torch.tensor(SLOTS))
    counts = {s: SLOTS.count(s) for s in sorted(set(SLOTS))}
    assert meta.active_lora_ids.tolist() == list(counts) + [-1]
    assert meta.num_tokens_per_lora.tolist() == list(counts.values()) + [0]
    order = meta.token_indices_sorted_by_lora_ids[: len(SLOTS)].tolist()
    assert [SLOTS[i] for i in order] == sorted(SLOTS)
    meta.prepare_tensors(torch.full((5,), -1))
    assert bool(meta.no_lora_flag_cpu.item())


@check
def check_lora_config_and_specialized_count() -> None:
    # Upstream's constructor (lora_config=); with specialize_active_lora the
    # kernels' grid covers only the groups present (2 adapters + base here).
    cfg = LoRAConfig(max_loras=MAX_LORAS, max_lora_rank=16, specialize_active_lora=True)
    w = PunicaWrapperGPU(64, 8, "cpu", lora_config=cfg)
    assert (w.max_loras, w.specialize_active_lora) == (MAX_LORAS, True)
    ids = [3, 0, 7, 7, 3]
    w.update_metadata(LoRAMapping(tuple(ids), tuple(ids)), LORA_IDS, MAX_LORAS, VOCAB)
    assert int(w.token_mapping_meta.meta_args(5, True)[-1].item()) == 3
    a, b = (
        stacked(MAX_LORAS, 8, HIDDEN, torch.float32, 8),
        stacked(MAX_LORAS, 24, 8, torch.float32, 9),
    )
    x, y0 = torch.randn(5, HIDDEN), torch.randn(5, 24)
    y = y0.clone()
    w.add_lora_linear(y, x, (a,), (b,), 2.0, (24,))
    _close(y, ref_lora(y0, x, [a], [b], [ID_TO_SLOT[i] for i in ids], 2.0), torch.float32)


@check
def check_all_base_and_embedding_and_logits() -> None:
    y0 = torch.randn(6, 24)
    y = y0.clone()
    a, b = (
        stacked(MAX_LORAS, 8, HIDDEN, torch.float32, 3),
        stacked(MAX_LORAS, 24, 8, torch.float32, 4),
    )
    _wrapper([0] * 6).add_lora_linear(y, torch.randn(6, HIDDEN), (a,), (b,), 1.0, (24,))
    assert torch.equal(y, y0), "an all-base batch changed y"
    # Embedding: expand only.
    w = _wrapper(TOKEN_IDS, prompt_ids=[11, 0, 7])
    be = stacked(MAX_LORAS, HIDDEN, 16, torch.float32, 5)
    xe, ye0 = torch.randn(len(SLOTS), 16), torch.randn(len(SLOTS), HIDDEN)
    ye = ye0.clone()
    w.add_lora_embedding(ye, xe, be)
    eye = torch.eye(16).reshape(1, 1, 16, 16).expand(MAX_LORAS, 1, 16, 16)
    _close(ye, ref_lora(ye0, xe, [eye], [be], SLOTS, 1.0), torch.float32)
    # Logits: keyed by the sampled rows' adapters.
    al, bl = (
        stacked(MAX_LORAS, 8, HIDDEN, torch.float32, 6),
        stacked(MAX_LORAS, VOCAB, 8, torch.float32, 7),
    )
    xl, yl0 = torch.randn(3, HIDDEN), torch.randn(3, VOCAB)
    yl = yl0.clone()
    w.add_lora_logits(yl, xl, al, bl, 0.5)
    _close(yl, ref_lora(yl0, xl, [al], [bl], [3, -1, 0], 0.5), torch.float32)


def main() -> None:
    verdicts = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            verdicts[name] = "ok"
        except Exception:  # noqa: BLE001 - reported to the test
            verdicts[name] = traceback.format_exc(limit=3)
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
