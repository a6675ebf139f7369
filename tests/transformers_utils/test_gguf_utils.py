"""The fast GGUF reader agrees with the `gguf` package and with transformers."""

from __future__ import annotations

import os

import numpy as np


def test_metadata_and_tensors_match_gguf_package(embedded_model_path):
    import gguf

    from vllm.transformers_utils.gguf_utils import read_gguf

    ours = read_gguf(embedded_model_path)
    ref = gguf.GGUFReader(embedded_model_path)
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    assert ours.metadata["llama.block_count"] == 30
    assert ours.metadata["tokenizer.ggml.tokens"] == ("<array>", 49152)  # skipped, counted
    for i in (0, 1, 2, 7):  # quantized and float tensors
        a, b = ours.tensors[i], ref.tensors[i]
        assert a.offset == b.data_offset
        np.testing.assert_array_equal(ours.tensor_data(a), gguf.dequantize(b.data, b.tensor_type))


def test_hf_config_matches_transformers(embedded_model_path):
    from transformers import AutoConfig

    from vllm.transformers_utils.gguf_utils import gguf_hf_config

    ours = gguf_hf_config(embedded_model_path)
    ref = AutoConfig.from_pretrained(
        os.path.dirname(embedded_model_path), gguf_file=os.path.basename(embedded_model_path)
    )
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "head_dim",
        "bos_token_id",
        "eos_token_id",
        "tie_word_embeddings",
        "rope_parameters",
    ):
        assert getattr(ours, key) == getattr(ref, key), key
    assert ours.architectures == ["LlamaForCausalLM"]
