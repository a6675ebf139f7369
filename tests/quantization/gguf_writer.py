"""Writes a tiny HF Llama (tests/utils.py make_tiny_model) as a complete .gguf
file, the way llama.cpp's converter lays it out: llama.* metadata, the BPE
tokenizer (gpt2 model, tokens, merges), q / k rows permuted for llama.cpp's
rotary, norms F32 and every matrix in the ggml type asked for.

Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 are quantized with gguf-py's own numpy
quantizer. gguf-py has no quantizer for the K-quants, so a K-quant matrix is
written as random blocks (random bits, finite f16 scales of the weight's
magnitude; any other type, e.g. one the engine refuses, as random bytes): the
model's weights are then whatever those blocks decode to, which is what both
the engine and the reference (gguf-py's `dequantize`) read.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from tests.utils import model_greedy

# GGUF short names of the HF Llama matrices -> "kind" used in the type maps below.
_KIND = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
    "embed_tokens": "token_embd", "lm_head": "output",
}  # fmt: skip
# Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: gguf-py quantizes them; other types are random blocks.
_NUMPY_QUANTIZED = (2, 3, 6, 7, 8)
# Byte offsets of the f16 scales in each K-quant block (set to finite values).
_K_QUANT_F16_AT = {10: (80, 82), 11: (108,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def _random_k_blocks(w: np.ndarray, qtype: int, rng: np.random.Generator) -> np.ndarray:
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    rows, cols = w.shape
    raw = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    scale = float(np.abs(w).mean()) / 16  # decoded weights of the weight's magnitude
    for at in _K_QUANT_F16_AT.get(qtype, ()):
        d = (rng.uniform(0.5, 1.5, raw.shape[0]) * scale).astype(np.float16)
        raw[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def _tokenizer(writer, src_dir: str) -> None:
    with open(os.path.join(src_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab = tok["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(0)


def write_tiny_gguf(
    src_dir: str, path: str, types: dict[str, int], default: int, tie: bool = False, seed: int = 0
) -> str:
    """src_dir's model as a .gguf at `path`. `types` maps a GGUF kind
    ("attn_q", "ffn_down", "token_embd", "output", ...) to its ggml type id,
    `default` is the type of every other matrix. `tie`: no output tensor (the
    head reads token_embd)."""
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(src_dir)
    state = load_file(os.path.join(src_dir, "model.safetensors"))
    rng = np.random.default_rng(seed)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    rope = getattr(cfg, "rope_parameters", None) or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    writer.add_vocab_size(cfg.vocab_size)
    _tokenizer(writer, src_dir)
    for name, tensor in state.items():
        if tie and name.startswith("lm_head."):
            continue
        module, _, suffix = name.rpartition(".")
        w = tensor.float().numpy()
        if ".q_proj." in name or ".k_proj." in name:
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            t = torch.from_numpy(w)
            w = t.reshape(heads, 2, w.shape[0] // heads // 2, -1).transpose(1, 2)
            w = w.reshape(tensor.shape).numpy()
        gguf_name = f"{name_map.get_name(module)}.{suffix}"
        if w.ndim != 2:
            writer.add_tensor(gguf_name, w.astype(np.float32))
            continue
        qtype = types.get(_KIND[module.rpartition(".")[2]], default)
        if qtype in _NUMPY_QUANTIZED:
            raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
        else:
            raw = _random_k_blocks(w, qtype, rng)
        writer.add_tensor(gguf_name, raw, raw_dtype=gguf.GGMLQuantizationType(qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_gguf_greedy(
    path: str, src_dir: str, prompts: list[list[int]], max_new_tokens: int
) -> list[list[int]]:
    """transformers' greedy tokens on the .gguf's weights as gguf-py's
    `dequantize` reads them (what transformers' own GGUF loading does; that
    path needs `accelerate`, not installed here), q / k rows un-permuted."""
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(src_dir)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    cfg.tie_word_embeddings = "output.weight" not in tensors
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    state = {}
    for name, like in load_file(os.path.join(src_dir, "model.safetensors")).items():
        module, _, suffix = name.rpartition(".")
        t = tensors.get(f"{name_map.get_name(module)}.{suffix}")
        if t is None:
            continue  # the tied head
        w = torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type)))
        w = w.reshape(like.shape).float()
        if ".q_proj." in name or ".k_proj." in name:
            heads = cfg.num_attention_heads if ".q_proj." in name else cfg.num_key_value_heads
            w = w.reshape(heads, w.shape[0] // heads // 2, 2, -1).transpose(1, 2)
            w = w.reshape(like.shape)
        state[name] = w
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model_greedy(model, prompts, max_new_tokens)
