"""Pooling-side metadata of the V1 runner (upstream: vllm/v1/pool/)."""
