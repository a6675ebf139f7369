"""Does a loaded adapter fit the served model? (no upstream counterpart).

Upstream copies each adapted module's A and B into the layer's slot buffers
and fails mid-copy (a RuntimeError, the slot half written) when an adapter
trained for another base model has other shapes, or silently ignores a
module name the model does not have. Here the whole adapter is checked
against the model's layers before it is registered: every module must exist
and every A [rank, in] / B [out, rank] must have the base layer's full
(unsharded) input and output sizes, slice by slice for packed layers. A
mismatch is a ValueError naming the module, the shapes and the likely cause.
"""

from __future__ import annotations

from torch import nn

from vllm.lora.lora_model import LoRAModel
from vllm.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
)
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)

MISMATCH_HINT = "the adapter was trained for a different base model"


def layer_lora_dims(layer: nn.Module) -> list[tuple[int, int]] | None:
    """(input, output) sizes a LoRA of `layer` must have, one pair per packed
    slice, over the whole layer (not a tensor-parallel shard). None: a layer
    kind this check does not know."""
    if isinstance(layer, QKVParallelLinear):
        q = layer.total_num_heads * layer.head_size
        kv = layer.total_num_kv_heads * layer.head_size
        return [(layer.hidden_size, q), (layer.hidden_size, kv), (layer.hidden_size, kv)]
    if isinstance(layer, MergedColumnParallelLinear):
        return [(layer.input_size, size) for size in layer.output_sizes]
    if isinstance(layer, LinearBase):
        return [(layer.input_size, layer.output_size)]
    if isinstance(layer, ParallelLMHead):
        # Logits = hidden @ W^T: A reads the hidden state, B writes vocab rows.
        return [(layer.embedding_dim, layer.org_vocab_size)]
    if isinstance(layer, VocabParallelEmbedding):
        # peft's lora_embedding_A is [rank, vocab]: A is looked up by token id.
        return [(layer.org_vocab_size, layer.embedding_dim)]
    return None


def in_model(name: str, model_modules: set[str], packed: dict[str, list[str]]) -> bool:
    """`name` is a module of the model, or a part (q_proj) of one of its
    packed modules (qkv_proj)."""
    if name in model_modules:
        return True
    prefix, _, suffix = name.rpartition(".")
    return any(
        suffix in parts and (f"{prefix}.{fused}" if prefix else fused) in model_modules
        for fused, parts in packed.items()
    )


def check_adapter_fits(
    lora_model: LoRAModel,
    layers: dict[str, nn.Module],
    model: nn.Module,
    packed_modules_mapping: dict[str, list[str]],
) -> None:
    """Refuse `lora_model` (ValueError) unless each of its modules is a module
    of `model` and, where it is one of the adapted `layers` (module name ->
    base layer, packed modules already merged), has that layer's sizes.

    A module that exists in `model` but is not adapted (left out by
    `LoRAConfig.target_modules`) is accepted and ignored, as upstream."""
    model_modules = {n for n, _ in model.named_modules(remove_duplicate=False)}
    for name, lora in lora_model.loras.items():
        if not in_model(name, model_modules, packed_modules_mapping):
            raise ValueError(
                f"LoRA adapter {lora_model.id} targets module {name}, which "
                f"{type(model).__name__} does not have ({MISMATCH_HINT}?)."
            )
        layer = layers.get(name)
        dims = None if layer is None else layer_lora_dims(layer)
        if dims is None:
            continue
        slices_a = lora.lora_a if isinstance(lora.lora_a, list) else [lora.lora_a]
        slices_b = lora.lora_b if isinstance(lora.lora_b, list) else [lora.lora_b]
        if len(slices_a) == 1 and len(dims) > 1:
            # A fused layer adapted as one module (Phi-3's qkv_proj): one A, one B
            # over all the fused outputs.
            dims = [(dims[0][0], sum(out for _, out in dims))]
        if len(slices_a) != len(dims):
            raise ValueError(
                f"LoRA module {name} has {len(slices_a)} slices, the model's layer "
                f"{len(dims)} ({MISMATCH_HINT}?)."
            )
        for (in_dim, out_dim), a, b in zip(dims, slices_a, slices_b):
            if a is None or b is None:
                continue  # slice not adapted
            if a.shape[-1] != in_dim or b.shape[0] != out_dim:
                raise ValueError(
                    f"LoRA module {name}: lora_A {tuple(a.shape)} and lora_B "
                    f"{tuple(b.shape)} do not fit the model's layer (input {in_dim}, "
                    f"output {out_dim}); {MISMATCH_HINT}."
                )
