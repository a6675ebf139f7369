"""Tiny random-weight models and tokenizers for tests (no hub: built here)."""

from __future__ import annotations

import os
from typing import Any

import torch

# Shapes small enough for a 2-core CI, big enough to exercise GQA and several blocks.
TINY_SHAPES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
TINY_VOCAB = 512
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. " * 4
    + "def hello(world):\n    return 42\n" * 4
    + "Paged attention stores keys and values in fixed-size blocks. " * 4
)


def make_tiny_tokenizer(out_dir: str, vocab_size: int = TINY_VOCAB):
    """A byte-level BPE tokenizer with exactly `vocab_size` tokens; id 0 is EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    n = tok.get_vocab_size()
    if n < vocab_size:  # pad so the tokenizer covers the whole embedding table
        tok.add_tokens([f"<|fill_{i}|>" for i in range(vocab_size - n)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(out_dir)
    return fast


def make_tiny_model(kind: str, out_dir: str, seed: int = 0, **overrides) -> str:
    """Save a tiny random `kind` model (llama, mistral, qwen2, qwen3) in float32
    with a tokenizer to `out_dir`; returns the directory."""
    import transformers as tf

    config_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }[kind]
    kwargs = dict(
        TINY_SHAPES,
        vocab_size=TINY_VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if kind == "qwen3":
        kwargs["head_dim"] = 16
    if kind == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    # Random init of norms is all-ones; perturb them so norm-weight bugs show.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model = model.to(torch.float32)
    model.config.dtype = torch.float32
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    make_tiny_tokenizer(out_dir)
    return out_dir


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' own greedy `generate`, one prompt at a time (no padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model_greedy(model, prompts, max_new_tokens)


def model_greedy(model: Any, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy `generate` on a model object (one built or hooked
    in the test rather than saved), one prompt at a time, no EOS stop."""
    outs = []
    with torch.no_grad():
        for ids in prompts:
            y = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs
