"""LoRA support of the models that share Llama's layout (SupportsLoRA +
embedding_modules inherited from LlamaForCausalLM): Qwen2 (q/k/v bias) and
Qwen3 (per-head q/k norms) with one adapter and the base model in one step
equal transformers' merged peft model row by row, float32."""

from __future__ import annotations

import pytest
import torch

from tests.lora.manager_utils import (
    build_adapters,
    lora_model_and_worker,
    merged_peft_logits,
    request,
    run_step,
)
from tests.utils import make_tiny_model
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
from vllm.model_executor.models.interfaces import supports_lora
from vllm.model_executor.models.mixtral import MixtralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_llama_layout_models_match_peft(kind, tmp_path):
    base = make_tiny_model(kind, str(tmp_path / kind))
    path = build_adapters(base, str(tmp_path / "adapters"), {"x": (8, 4)})["x"]
    model, worker, config = lora_model_and_worker(base, max_loras=1, max_cpu_loras=1)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (6, 9)]
    batch = [(prompts[0], request("x", 1, path)), (prompts[1], None)]
    for (tokens, req), ours in zip(batch, run_step(model, config, worker, batch)):
        ref = merged_peft_logits(base, None if req is None else path, tokens)
        torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_lora_support_flags():
    """Llama-layout models take LoRA; DeepSeek-V2 does not (MLA reads
    kv_b_proj's weight directly, so a LoRA around it would never run)."""
    for cls in (Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM):
        assert supports_lora(cls) and cls.embedding_modules == {
            "embed_tokens": "input_embeddings",
            "lm_head": "output_embeddings",
        }
    assert not supports_lora(DeepseekV2ForCausalLM)
