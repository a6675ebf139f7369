"""The LoRA linear layers (vllm/lora/layers/) against a dense per-token
float64 reference built from the adapters' own A [r, in] / B [out, r]
(not the layers' stacked slots): several adapters in slots (ranks 8 and 16,
one slot free, one adapter leaving a slice of a packed layer untargeted),
tokens mapped to slots with base (-1) tokens among them, prefill (sgmv) and
decode (bgmv) layouts, float32 and bfloat16; reset_lora restores the base
output; from_layer picks upstream's class. TP=2: tests/lora/test_layers_tp.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from tests.lora.lora_ref import TOL
from vllm.config.lora import LoRAConfig
from vllm.lora.layers import (
    BaseLayerWithLoRA,
    ColumnParallelLinearWithLoRA,
    ColumnParallelLinearWithShardedLoRA,
    LoRAMapping,
    MergedColumnParallelLinearWithLoRA,
    MergedColumnParallelLinearWithShardedLoRA,
    MergedQKVParallelLinearWithLoRA,
    MergedQKVParallelLinearWithShardedLoRA,
    QKVParallelLinearWithLoRA,
    QKVParallelLinearWithShardedLoRA,
    ReplicatedLinearWithLoRA,
    RowParallelLinearWithLoRA,
    RowParallelLinearWithShardedLoRA,
)
from vllm.lora.punica_wrapper import PunicaWrapperBase
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU
from vllm.lora.utils import from_layer
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)

HIDDEN, MAX_LORAS, MAX_RANK = 64, 4, 16
# Slot s holds LoRA id LORA_IDS[s]; slot 2 is free.
LORA_IDS: list[int | None] = [1, 2, None, 3]
RANKS = {1: 8, 2: 16, 3: 8}
# Per-token LoRA ids (0 = base model): runs (prefill segments) and singles.
TOKEN_IDS = [1, 1, 1, 0, 2, 2, 3, 0, 0, 2, 1, 3, 3, 0]


@dataclass(frozen=True)
class Case:
    """A base layer and how adapters target it: `packed` as the model's
    packed_modules_mapping lists it; `slices` the full output size of each
    adapter slice (one for an unpacked layer); `untargeted`: (LoRA id,
    slice) left None by that adapter."""

    kind: str
    packed: tuple[str, ...]
    in_size: int
    slices: tuple[int, ...]
    untargeted: tuple[int, int] | None = None


CASES = {
    "column": Case("column", ("dense_h_to_4h",), HIDDEN, (96,)),
    "gate_up": Case("merged", ("gate_proj", "up_proj"), HIDDEN, (48, 48), (2, 1)),
    "gate_up_single": Case("merged", ("gate_up_proj",), HIDDEN, (96,)),
    # q: 4 heads of 16; k / v: 2 KV heads (GQA).
    "qkv": Case("qkv2", ("q_proj", "k_proj", "v_proj"), HIDDEN, (64, 32, 32), (3, 1)),
    # One KV head: with TP=2 both ranks hold it (replicated).
    "qkv_single": Case("qkv1", ("qkv_proj",), HIDDEN, (64 + 16 + 16,)),
    "row": Case("row", ("o_proj",), 96, (HIDDEN,)),
    "replicated": Case("replicated", ("gate",), HIDDEN, (40,)),
}

EXPECTED_CLASS = {
    "column": ColumnParallelLinearWithLoRA,
    "gate_up": MergedColumnParallelLinearWithLoRA,
    "gate_up_single": ColumnParallelLinearWithLoRA,
    "qkv": MergedQKVParallelLinearWithLoRA,
    "qkv_single": QKVParallelLinearWithLoRA,
    "row": RowParallelLinearWithLoRA,
    "replicated": ReplicatedLinearWithLoRA,
}
EXPECTED_SHARDED_CLASS = {
    "column": ColumnParallelLinearWithShardedLoRA,
    "gate_up": MergedColumnParallelLinearWithShardedLoRA,
    "gate_up_single": ColumnParallelLinearWithShardedLoRA,
    "qkv": MergedQKVParallelLinearWithShardedLoRA,
    "qkv_single": QKVParallelLinearWithShardedLoRA,
    "row": RowParallelLinearWithShardedLoRA,
    "replicated": ReplicatedLinearWithLoRA,
}


def _randn(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _base_layer(case: Case, dtype: torch.dtype) -> torch.nn.Module:
    """The base layer with seeded full weights loaded through its weight
    loaders (so each TP rank gets its shard), CPU-packed as at runtime."""
    kind, out = case.kind, sum(case.slices)
    if kind == "column":
        layer = ColumnParallelLinear(case.in_size, out, bias=True, params_dtype=dtype)
    elif kind == "merged":
        layer = MergedColumnParallelLinear(case.in_size, [48, 48], bias=True, params_dtype=dtype)
    elif kind in ("qkv2", "qkv1"):
        kv = 2 if kind == "qkv2" else 1
        layer = QKVParallelLinear(HIDDEN, 16, 4, kv, bias=True, params_dtype=dtype)
    elif kind == "row":
        layer = RowParallelLinear(case.in_size, out, bias=True, params_dtype=dtype)
    else:
        layer = ReplicatedLinear(case.in_size, out, bias=True, params_dtype=dtype)
    weight = _randn(100, out, case.in_size, scale=case.in_size**-0.5).to(dtype)
    bias = _randn(101, out, scale=0.1).to(dtype)
    for param, full in ((layer.weight, weight), (layer.bias, bias)):
        if kind == "merged":
            for i, (lo, hi) in enumerate(((0, 48), (48, 96))):
                param.weight_loader(param, full[lo:hi], i)
        elif kind in ("qkv2", "qkv1"):
            kv = 32 if kind == "qkv2" else 16
            for sid, (lo, hi) in zip("qkv", ((0, 64), (64, 64 + kv), (64 + kv, out))):
                param.weight_loader(param, full[lo:hi], sid)
        else:
            param.weight_loader(param, full)
    layer.process_weights_after_loading(dtype)
    return layer


def _adapter(case: Case, lora_id: int, dtype: torch.dtype) -> tuple[list, list]:
    """One adapter's per-slice A [r, in] and B [out_s, r] (scaling folded
    into B, as the model manager hands them over); None where untargeted."""
    r = RANKS[lora_id]
    a_list: list[torch.Tensor | None] = []
    b_list: list[torch.Tensor | None] = []
    for s, out in enumerate(case.slices):
        if case.untargeted == (lora_id, s):
            a_list.append(None)
            b_list.append(None)
            continue
        seed = 1000 * lora_id + 10 * s
        a_list.append(_randn(seed, r, case.in_size, scale=case.in_size**-0.5).to(dtype))
        b_list.append(_randn(seed + 1, out, r, scale=0.5 * r**-0.5).to(dtype))
    return a_list, b_list


def _x(case: Case, dtype: torch.dtype) -> torch.Tensor:
    return _randn(7, len(TOKEN_IDS), case.in_size).to(dtype)


def _lora_config(dtype: torch.dtype, fully_sharded: bool = False) -> LoRAConfig:
    return LoRAConfig(
        max_lora_rank=MAX_RANK,
        max_loras=MAX_LORAS,
        lora_dtype=dtype,
        fully_sharded_loras=fully_sharded,
    )


def _cpu_wrapper() -> PunicaWrapperBase:
    return PunicaWrapperCPU(max_num_batched_tokens=64, max_batches=16, device="cpu")


# The Punica wrapper the layers get (test_layers_triton.py swaps in the GPU
# one, run by Triton's interpreter on these CPU tensors).
WRAPPER_FACTORY: list[Callable[[], PunicaWrapperBase]] = [_cpu_wrapper]


def make_wrapper(token_ids: tuple[int, ...], sampled: tuple[int, ...], prefill: bool, vocab: int):
    """A wrapper with the step's mapping (LoRA id per token / sampled row) set."""
    wrapper = WRAPPER_FACTORY[0]()
    wrapper.update_metadata(LoRAMapping(token_ids, sampled, prefill), LORA_IDS, MAX_LORAS, vocab)
    return wrapper


def _wrapped(
    case: Case, dtype: torch.dtype, prefill: bool, fully_sharded: bool = False
) -> tuple[BaseLayerWithLoRA, torch.nn.Module]:
    """(LoRA layer with adapters 1-3 in their slots and the step's mapping
    set, the base layer it wraps)."""
    base = _base_layer(case, dtype)
    layer = from_layer(base, MAX_LORAS, _lora_config(dtype, fully_sharded), list(case.packed))
    assert isinstance(layer, BaseLayerWithLoRA)
    for slot, lora_id in enumerate(LORA_IDS):
        if lora_id is None:
            continue
        a, b = _adapter(case, lora_id, dtype)
        if len(case.slices) == 1:
            layer.set_lora(slot, a[0], b[0])
        else:
            layer.set_lora(slot, a, b)
    layer.set_mapping(make_wrapper(tuple(TOKEN_IDS), tuple(TOKEN_IDS), prefill, 128))
    return layer, base


def _reference(case: Case, x: torch.Tensor, base_out: torch.Tensor) -> torch.Tensor:
    """base_out + x[t] @ A_s.T @ B_s.T per token and slice, in float64."""
    out = base_out.double().clone()
    adapters = {i: _adapter(case, i, x.dtype) for i in RANKS}
    for t, lora_id in enumerate(TOKEN_IDS):
        if lora_id == 0:
            continue
        off = 0
        for a, b, size in zip(*adapters[lora_id], case.slices):
            if a is not None and b is not None:
                out[t, off : off + size] += (x[t].double() @ a.double().t()) @ b.double().t()
            off += size
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_from_layer_picks_upstreams_class(name):
    case = CASES[name]
    layer = from_layer(
        _base_layer(case, torch.float32), 2, _lora_config(torch.float32), list(case.packed)
    )
    assert type(layer) is EXPECTED_CLASS[name]
    assert layer.lora_a_stacked[0].shape == (2, 1, MAX_RANK, case.in_size)
    assert [b.shape[2] for b in layer.lora_b_stacked] == (
        list(case.slices) if len(case.packed) > 1 else [sum(case.slices)]
    )
    assert all(t.dtype == torch.float32 and not t.any() for t in layer.lora_a_stacked)


def test_from_layer_leaves_other_layers():
    plain = torch.nn.Linear(4, 4)
    assert from_layer(plain, 2, _lora_config(torch.float32), ["x"]) is plain


@pytest.mark.parametrize("prefill", [True, False], ids=["prefill", "decode"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_output_equals_base_plus_dense_reference(name, dtype, prefill):
    case = CASES[name]
    layer, base = _wrapped(case, dtype, prefill)
    x = _x(case, dtype)
    base_out, base_bias = base(x)
    out, out_bias = layer(x)
    assert out.dtype == dtype and out.shape == base_out.shape and out_bias is base_bias
    want = _reference(case, x, base_out)
    # Values are O(1); see lora_ref.TOL (bf16: inputs, weights, output rounded).
    torch.testing.assert_close(out.double(), want, atol=TOL[dtype], rtol=0)
    untouched = torch.tensor(TOKEN_IDS) == 0
    assert torch.equal(out[untouched], base_out[untouched])
    # The LoRA deltas are not negligible (the check above could not pass by accident).
    assert (want - base_out.double())[~untouched].abs().max() > 0.3


@pytest.mark.parametrize("name", ["gate_up", "qkv", "row"])
def test_reset_lora_restores_base(name):
    case = CASES[name]
    layer, base = _wrapped(case, torch.float32, prefill=True)
    x = _x(case, torch.float32)
    base_out = base(x)[0]
    layer.reset_lora(1)  # LoRA id 2's slot
    out = layer(x)[0]
    id2 = torch.tensor(TOKEN_IDS) == 2
    assert torch.equal(out[id2], base_out[id2])
    assert not torch.allclose(out[~id2], base_out[~id2])
    for slot in range(MAX_LORAS):
        layer.reset_lora(slot)
    assert torch.equal(layer(x)[0], base_out)


def test_set_lora_refuses_what_does_not_fit():
    case = CASES["column"]
    layer, _ = _wrapped(case, torch.float32, prefill=True)
    with pytest.raises(ValueError, match=r"lora_a of shape \(32, 64\)"):
        layer.set_lora(0, torch.zeros(32, HIDDEN), torch.zeros(96, 32))
    with pytest.raises(ValueError, match=r"lora_b of shape \(95, 8\)"):
        layer.set_lora(0, torch.zeros(8, HIDDEN), torch.zeros(95, 8))


def test_skip_bias_add_returns_the_bias_like_the_base():
    base = ColumnParallelLinear(HIDDEN, 32, bias=True, skip_bias_add=True)
    torch.nn.init.normal_(base.weight)
    torch.nn.init.normal_(base.bias)
    layer = from_layer(base, 1, _lora_config(torch.float32), ["dense"])
    wrapper = PunicaWrapperCPU(8, 4, "cpu")
    wrapper.update_metadata(LoRAMapping((0, 0), (0, 0), True), [None], 1, 128)
    layer.set_mapping(wrapper)
    x = torch.randn(2, HIDDEN)
    out, bias = layer(x)
    assert bias is base.bias
    assert torch.equal(out, base(x)[0])
