"""get_tokenizer: local folders, GGUF files (through the on-disk cache), errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm.transformers_utils import tokenizer as tokenizer_mod
from vllm.transformers_utils.tokenizer import get_tokenizer

SAMPLES = ["The capital of France is", "héllo 日本語 🎉", "<|im_start|>user\nhi<|im_end|>"]


def test_gguf_tokenizer_cache_matches_a_direct_load(embedded_model_path, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(tokenizer_mod, "_CACHE", {})
    first = get_tokenizer(embedded_model_path)
    saved = list(tmp_path.glob("vllm/gguf_tokenizers/*/tokenizer.json"))
    assert len(saved) == 1
    assert get_tokenizer(embedded_model_path) is first  # per-process cache
    monkeypatch.setattr(tokenizer_mod, "_CACHE", {})
    from_disk = get_tokenizer(embedded_model_path)
    assert from_disk is not first
    gguf = Path(embedded_model_path)
    direct = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for tok in (first, from_disk):
        assert tok.eos_token_id == direct.eos_token_id
        assert tok.chat_template == direct.chat_template
        for text in SAMPLES:
            ids = direct.encode(text)
            assert tok.encode(text) == ids
            assert tok.decode(ids) == direct.decode(ids)


def test_folder_tokenizer_and_missing_path(tmp_path):
    from tests.utils import make_tiny_tokenizer

    make_tiny_tokenizer(str(tmp_path))
    tok = get_tokenizer(str(tmp_path))
    assert tok.decode(tok.encode("The quick brown fox")) == "The quick brown fox"
    with pytest.raises(ValueError, match="does not exist"):
        get_tokenizer(str(tmp_path / "missing"))


def test_loaded_tokenizers_provide_tokenizer_like(embedded_model_path, tmp_path):
    """Every member of `TokenizerLike` exists on what the loader hands out (a
    GGUF file's tokenizer and a folder's), so the protocol names real methods."""
    from tests.utils import make_tiny_tokenizer
    from vllm.tokenizers import TokenizerLike

    members = [
        name for name in vars(TokenizerLike) if not name.startswith("_") or name == "__len__"
    ]
    assert {"encode", "decode", "convert_ids_to_tokens", "eos_token_id"} <= set(members)
    make_tiny_tokenizer(str(tmp_path))
    for tok in (get_tokenizer(embedded_model_path), get_tokenizer(str(tmp_path))):
        missing = [name for name in members if not hasattr(tok, name)]
        assert not missing, f"{type(tok).__name__} lacks {missing}"
