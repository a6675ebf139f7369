"""Attention layer variants (upstream: vllm/attention/layers/)."""
