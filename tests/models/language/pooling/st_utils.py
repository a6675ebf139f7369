"""Tiny pooling checkpoints for the pooling tests (no hub): random HF
decoders saved as sentence-transformers directories, and random
*ForSequenceClassification models."""

from __future__ import annotations

import os

import torch

from tests.utils import make_tiny_model

# LLM(...) keywords of the pooling tests: float32, short contexts, a small KV cache.
ENGINE = dict(dtype="float32", max_model_len=256, kv_cache_memory_bytes=1 << 26)


def make_st_dir(kind: str, out_dir: str, pooling_mode: str, seed: int = 0) -> str:
    """A tiny random `kind` decoder wrapped as a sentence-transformers model:
    Transformer -> Pooling(`pooling_mode`: "lasttoken", "mean", "cls") ->
    Normalize, saved (modules.json, 1_Pooling/config.json, 2_Normalize,
    sentence_bert_config.json) to `out_dir`."""
    from sentence_transformers import SentenceTransformer, models

    hf_dir = make_tiny_model(kind, os.path.join(out_dir, "_hf"), seed=seed)
    transformer = models.Transformer(hf_dir, max_seq_length=256)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling_mode)
    st = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    st.save(out_dir)
    return out_dir


def make_seq_cls_model(kind: str, out_dir: str, num_labels: int, seed: int = 0) -> str:
    """A tiny random HF `{Llama,Qwen2,Qwen3}ForSequenceClassification` in
    float32: `make_tiny_model`'s causal LM re-saved with a random score head
    [num_labels, hidden] (its LM head dropped)."""
    import transformers as tf

    make_tiny_model(kind, out_dir, seed=seed, num_labels=num_labels)
    torch.manual_seed(seed)
    model = tf.AutoModelForSequenceClassification.from_pretrained(out_dir, dtype=torch.float32)
    with torch.no_grad():  # a score head large enough that the logits differ clearly
        model.score.weight.normal_(0.0, 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
