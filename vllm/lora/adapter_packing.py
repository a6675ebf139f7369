"""A loaded adapter laid out as the model's LoRA layers take it (upstream:
`LoRAModelManager._create_merged_loras_inplace` and `create_dummy_lora` in
vllm/lora/model_manager.py, which calls these).

- Packed modules: the model fuses q/k/v_proj into qkv_proj and gate/up_proj
  into gate_up_proj; a peft adapter names the parts. Their weights are packed
  into one `PackedLoRALayerWeights` under the fused name (None for a part the
  adapter leaves out), and every scaling is folded into B.
- Pooling models: an adapter trained on the bare body has names without the
  `model.` prefix they have here; they are prefixed (upstream's rule).
- Warm-up: an all-zero adapter over every adapted module, at full sizes.
"""

from __future__ import annotations

import torch
from torch import nn

from vllm.lora.adapter_shapes import in_model, layer_lora_dims
from vllm.lora.lora_model import LoRAModel
from vllm.lora.lora_weights import LoRALayerWeights, PackedLoRALayerWeights


def add_body_prefix(
    model: nn.Module, lora_model: LoRAModel, packed_modules_mapping: dict[str, list[str]]
) -> None:
    """Rename, in place, the adapter's modules the model has only under
    `model.` (AutoModel's `layers.0.self_attn.q_proj` -> `model.layers...`)."""
    names = {n for n, _ in model.named_modules(remove_duplicate=False)}
    mapping = packed_modules_mapping
    for name in list(lora_model.loras):
        if not in_model(name, names, mapping) and in_model(f"model.{name}", names, mapping):
            lora = lora_model.loras.pop(name)
            lora.module_name = f"model.{name}"
            lora_model.loras[lora.module_name] = lora


def merge_packed_loras(lora_model: LoRAModel, packed_modules: dict[str, list[str]]) -> None:
    """Pack, in place, the parts of each packed module (`packed_modules`:
    fused full name -> parts' full names) and fold every scaling into B."""
    for module_name, part_names in packed_modules.items():
        parts: list[LoRALayerWeights | None] = [lora_model.get_lora(n) for n in part_names]
        if all(p is None for p in parts):
            continue
        lora_model.loras[module_name] = PackedLoRALayerWeights.pack(parts)
        for name in part_names:
            lora_model.loras.pop(name, None)
    for lora in lora_model.loras.values():
        lora.optimize()


def create_dummy_lora(
    lora_id: int,
    rank: int,
    base_layers: dict[str, nn.Module],
    packed_modules: dict[str, list[str]],
    dtype: torch.dtype,
) -> LoRAModel:
    """An all-zero adapter (on CPU) over `base_layers` (adapted module name ->
    the layer whose shapes its LoRA must have), packed like a real one."""
    model = LoRAModel(lora_id, rank, {})
    for module_name, layer in base_layers.items():
        dims = layer_lora_dims(layer)  # (in, out) per slice; None: not sized here
        if dims is None:
            continue
        loras: list[LoRALayerWeights | None] = [
            LoRALayerWeights.create_dummy_lora_weights(
                f"{module_name}.slice_{i}", in_dim, out_dim, rank, dtype, "cpu"
            )
            for i, (in_dim, out_dim) in enumerate(dims)
        ]
        if module_name in packed_modules:
            model.loras[module_name] = PackedLoRALayerWeights.pack(loras)
        else:
            lora = loras[0]
            assert lora is not None
            lora.module_name = module_name
            model.loras[module_name] = lora
    return model
