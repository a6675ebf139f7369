"""A BERT-base-sized random-weight embedding model as a sentence-transformers
directory, for the pooling benchmark (benchmarks/benchmark_pooling_peer.py).

    python benchmarks/make_bert_checkpoint.py [OUT_DIR]

(OUT_DIR defaults to ~/.cache/vllm-peer/models/bert-base-st.)

The model is a transformers BertModel with bert-base-uncased's shapes (hidden
768, 12 layers, 12 heads, intermediate 3072, 512 positions, vocab 30522),
random weights (seed 0), saved in float32 (~440 MB). The directory holds what
a sentence-transformers checkpoint holds: the HF model and tokenizer files at
the top, modules.json (Transformer -> Pooling), sentence_bert_config.json and
1_Pooling/config.json (mean pooling), so both engines pick mean pooling from
the directory itself.

The tokenizer is a BertTokenizerFast over a generated vocab.txt laid out like
bert-base-uncased's: [PAD] 0, [unused0..98] 1-99, [UNK] 100, [CLS] 101,
[SEP] 102, [MASK] 103, then single characters and generated lowercase words
and "##" continuations up to 30522 entries. No download.
"""

from __future__ import annotations

import itertools
import json
import os
import string
import sys

VOCAB_SIZE = 30522
SHAPES = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    type_vocab_size=2,
)


def _vocab() -> list[str]:
    """bert-base-uncased's special-token layout, then made-up word pieces."""
    vocab = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab += list(chars) + [f"##{c}" for c in string.ascii_lowercase + string.digits]
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]  # 90 syllables
    for n in (1, 2, 3):
        for parts in itertools.product(syllables, repeat=n):
            word = "".join(parts)
            vocab += [word, f"##{word}"]
            if len(vocab) >= VOCAB_SIZE:
                return vocab[:VOCAB_SIZE]
    raise AssertionError("not enough generated words")


def _tokenizer(vocab: list[str]):
    """A BertTokenizerFast over `vocab`: BERT's lowercasing normalizer and
    pre-tokenizer, WordPiece, and [CLS] A [SEP] (B [SEP]) around the pieces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    ids = {tok: i for i, tok in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    specials = dict(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]")
    specials.update(cls_token="[CLS]", mask_token="[MASK]")
    return BertTokenizerFast(tokenizer_object=tok, model_max_length=512, **specials)


def _write_json(path: str, obj: object) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


def make(out_dir: str) -> str:
    """Model, tokenizer and the sentence-transformers files, written in the
    classic layout (module types sentence_transformers.models.*, one
    pooling_mode_* flag) that every reader of these directories knows."""
    import torch
    import transformers as tf

    os.makedirs(os.path.join(out_dir, "1_Pooling"), exist_ok=True)
    vocab = _vocab()
    with open(os.path.join(out_dir, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    _tokenizer(vocab).save_pretrained(out_dir)
    torch.manual_seed(0)
    model = tf.BertModel(tf.BertConfig(**SHAPES), add_pooling_layer=False).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
    _write_json(
        os.path.join(out_dir, "modules.json"),
        [
            {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{cls}"}
            for i, (path, cls) in enumerate(modules)
        ],
    )
    _write_json(
        os.path.join(out_dir, "sentence_bert_config.json"),
        {"max_seq_length": 512, "do_lower_case": False},
    )
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
    pooling = {"word_embedding_dimension": SHAPES["hidden_size"]}
    pooling.update({f"pooling_mode_{m}": m == "mean_tokens" for m in modes})
    _write_json(os.path.join(out_dir, "1_Pooling", "config.json"), pooling)
    return out_dir


def main() -> None:
    default = os.path.expanduser("~/.cache/vllm-peer/models/bert-base-st")
    out_dir = sys.argv[1] if len(sys.argv) > 1 else default
    if os.path.exists(os.path.join(out_dir, "modules.json")):
        print(f"{out_dir} exists")
        return
    print(make(out_dir))


if __name__ == "__main__":
    main()
