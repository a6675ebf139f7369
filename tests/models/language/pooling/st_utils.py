"""Tiny pooling checkpoints for the pooling tests (no hub): random HF
decoders saved as sentence-transformers directories, and random
*ForSequenceClassification models."""

from __future__ import annotations

import os

import torch

from tests.utils import TINY_SHAPES, TINY_VOCAB, make_tiny_model, make_tiny_tokenizer


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
    """A tiny random HF `{Llama,Qwen2,Qwen3}ForSequenceClassification` in float32."""
    import transformers as tf

    config_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForSequenceClassification),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForSequenceClassification),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForSequenceClassification),
    }[kind]
    kwargs = dict(
        TINY_SHAPES,
        vocab_size=TINY_VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        num_labels=num_labels,
    )
    if kind == "qwen3":
        kwargs["head_dim"] = 16
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval().to(torch.float32)
    with torch.no_grad():  # a score head large enough that the logits differ clearly
        model.score.weight.normal_(0.0, 0.5)
    model.config.dtype = torch.float32
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    make_tiny_tokenizer(out_dir)
    return out_dir
