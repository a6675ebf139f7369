"""Phi-3 for causal LM (upstream: vllm/model_executor/models/phi3.py).

Llama's decoder; the checkpoint stores q/k/v fused as `qkv_proj` and gate/up
fused as `gate_up_proj`, and rotary may cover only part of each head
(`partial_rotary_factor`). The fused tensors are split into their q/k/v and
gate/up parts on load, so each part goes through its shard loader and lands
in the right rows of every tensor-parallel rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch

from vllm.model_executor.models.llama import LlamaForCausalLM

WeightsIter = Iterable[tuple[str, torch.Tensor]]


class Phi3ForCausalLM(LlamaForCausalLM):
    # Upstream's: the checkpoint's (and so a peft adapter's) modules are the
    # fused qkv_proj and gate_up_proj, each adapted as one LoRA over all of its
    # outputs.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["qkv_proj"],
        "gate_up_proj": ["gate_up_proj"],
    }

    def load_weights(self, weights: WeightsIter) -> set[str]:
        return super().load_weights(self._split_fused(weights))

    def _split_fused(self, weights: WeightsIter) -> Iterator[tuple[str, torch.Tensor]]:
        """qkv_proj [q; k; v] -> q_proj, k_proj, v_proj; gate_up_proj [gate; up]
        -> gate_proj, up_proj (the checkpoint names Llama's loader expects)."""
        cfg = self.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        q_size = cfg.num_attention_heads * head_dim
        kv_size = cfg.num_key_value_heads * head_dim
        for name, weight in weights:
            if ".qkv_proj." in name:
                parts = weight.split([q_size, kv_size, kv_size], dim=0)
                for part_name, part in zip(("q_proj", "k_proj", "v_proj"), parts):
                    yield name.replace("qkv_proj", part_name), part
            elif ".gate_up_proj." in name:
                gate, up = weight.chunk(2, dim=0)
                yield name.replace("gate_up_proj", "gate_proj"), gate
                yield name.replace("gate_up_proj", "up_proj"), up
            else:
                yield name, weight
