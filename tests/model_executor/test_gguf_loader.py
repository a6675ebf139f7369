"""The embedded SmolLM2 GGUF (Q4_1) loads, dequantized, and answers sensibly."""
from __future__ import annotations

import os

import pytest
import torch

from tests.model_executor.paged_harness import PagedHarness
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import GGUFModelLoader, get_model, get_model_loader
from vllm.model_executor.model_loader.gguf_loader import _reverse_llama_qk_permute


@pytest.mark.slow
def test_embedded_gguf_greedy_next_token_is_paris(embedded_model_path):
    from transformers import AutoTokenizer

    config = EngineArgs(model=embedded_model_path, dtype="float32",
                        device="cpu").create_engine_config()
    assert isinstance(get_model_loader(config.load_config, config.model_config),
                      GGUFModelLoader)
    model = get_model(vllm_config=config)
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(embedded_model_path),
                                              gguf_file=os.path.basename(embedded_model_path))
    prompt_ids = tokenizer("The capital of France is")["input_ids"]
    harness = PagedHarness(model, config, num_blocks=8)
    (logits,) = harness.step([("r", prompt_ids)])
    assert logits.shape == (len(prompt_ids), config.model_config.get_vocab_size())
    assert tokenizer.decode([int(logits[-1].argmax())]) == " Paris"


def test_reverse_llama_qk_permute_inverts_llama_cpp_permute():
    n_head, head_dim, cols = 3, 8, 5
    w = torch.randn(n_head * head_dim, cols)
    # llama.cpp's convert script: rows of each head reordered as (2, d/2) -> (d/2, 2).
    permuted = w.reshape(n_head, 2, head_dim // 2, cols).transpose(1, 2).reshape(w.shape)
    torch.testing.assert_close(_reverse_llama_qk_permute(permuted, n_head), w)
