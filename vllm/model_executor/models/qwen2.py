"""Qwen2 for causal LM (upstream: vllm/model_executor/models/qwen2.py).

Same decoder as Llama except the attention: q/k/v projections carry a bias,
the output projection does not.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from vllm.config import VllmConfig
from vllm.model_executor.models.adapters import as_seq_cls_model
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM


class Qwen2DecoderLayer(LlamaDecoderLayer):
    @classmethod
    def _attention_biases(cls, config: PretrainedConfig) -> tuple[bool, bool]:
        return True, False


class Qwen2ForCausalLM(LlamaForCausalLM):
    def __init__(
        self,
        *,
        vllm_config: VllmConfig,
        prefix: str = "",
        layer_type: type[LlamaDecoderLayer] = Qwen2DecoderLayer,
    ) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)


# HF's Qwen2ForSequenceClassification: the body plus a bias-free `score` head
# over the last token (runner="pooling"; see models/adapters.py).
Qwen2ForSequenceClassification = as_seq_cls_model(Qwen2ForCausalLM)
