"""Shared fixtures of the structured output tests: one byte-level tokenizer
(every byte is a token, so JSON punctuation and letters all exist) and an
xgrammar backend over it, built once per session."""

from __future__ import annotations

import pytest

from tests.utils import TINY_VOCAB, make_tiny_tokenizer

# The logits width of the backend fixture: wider than the tokenizer (512
# tokens) as a padded embedding table is, so padding ids can be checked.
PADDED_VOCAB = TINY_VOCAB + 13


@pytest.fixture(scope="session")
def so_tokenizer(tmp_path_factory):
    return make_tiny_tokenizer(str(tmp_path_factory.mktemp("so-tokenizer")))


@pytest.fixture(scope="session")
def xgr_backend(so_tokenizer):
    from vllm.config import VllmConfig
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    return XgrammarBackend(VllmConfig(), tokenizer=so_tokenizer, vocab_size=PADDED_VOCAB)
