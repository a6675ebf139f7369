"""Tokenizer types (upstream: vllm/tokenizers/). Loading stays in
vllm/transformers_utils/tokenizer.py."""

from vllm.tokenizers.protocol import TokenizerLike

__all__ = ["TokenizerLike"]
