"""The embedded SmolLM2 GGUF (Q4_1 linears, Q8_0 tied table) loads kept
quantized and answers sensibly; GGUF names and llama.cpp's q / k permutation
map back onto the model (tests/quantization/test_gguf_quantized.py tests the
quantized types)."""

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

    config = EngineArgs(
        model=embedded_model_path, dtype="bfloat16", device="cpu"
    ).create_engine_config()
    assert isinstance(get_model_loader(config.load_config, config.model_config), GGUFModelLoader)
    model = get_model(vllm_config=config)
    # Kept quantized (bf16, its default dtype): Q4_1 linears as int4 packed two
    # per byte, the Q8_0 table (also the tied head) as int8; 99.3 MB in all
    # (the file is 98.4 MB; dense bf16 took 326.7 MB with the head's packed copy).
    assert model.model.layers[0].self_attn.qkv_proj.qweight.dtype == torch.uint8
    assert model.lm_head is model.model.embed_tokens
    assert model.model.embed_tokens.qweight.dtype == torch.int8
    assert model.model_weight_bytes < 120e6
    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(embedded_model_path), gguf_file=os.path.basename(embedded_model_path)
    )
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


def _write_gguf(path, arch: str, state: dict[str, torch.Tensor], hf_config, permute_qk: bool):
    """A float32 .gguf of an HF state dict, named and (for llama) permuted the way
    llama.cpp's converter does it."""
    import gguf

    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, hf_config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    for name, tensor in state.items():
        module, _, suffix = name.rpartition(".")
        w = tensor.float()
        if permute_qk and (".q_proj." in name or ".k_proj." in name):
            heads = (
                hf_config.num_attention_heads
                if ".q_proj." in name
                else hf_config.num_key_value_heads
            )
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2)
            w = w.reshape(tensor.shape)
        writer.add_tensor(f"{name_map.get_name(module)}.{suffix}", w.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind,arch", [("llama", "llama"), ("qwen2", "qwen2"), ("qwen3", "qwen3")])
def test_gguf_names_and_llama_permutation_roundtrip(tiny_model_dir, tmp_path, kind, arch):
    """An HF checkpoint rewritten as GGUF loads into the same model."""
    from safetensors.torch import load_file

    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    model_dir = tiny_model_dir(kind)
    state = load_file(os.path.join(model_dir, "model.safetensors"))
    gguf_path = tmp_path / "model.gguf"
    config = EngineArgs(model=model_dir, dtype="float32", device="cpu").create_engine_config()
    _write_gguf(gguf_path, arch, state, config.model_config.hf_config, permute_qk=arch == "llama")

    ref = initialize_model(config)
    ref.load_weights(safetensors_weights_iterator([os.path.join(model_dir, "model.safetensors")]))
    config2 = EngineArgs(model=model_dir, dtype="float32", device="cpu").create_engine_config()
    config2.model_config.gguf_file = str(gguf_path)
    model = initialize_model(config2)
    GGUFModelLoader(config2.load_config).load_weights(model, config2.model_config)
    ref_params = dict(ref.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param, ref_params[name], atol=0, rtol=0, msg=name)
