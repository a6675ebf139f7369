"""Helpers of the server (upstream: vllm/entrypoints/serve/utils/)."""
