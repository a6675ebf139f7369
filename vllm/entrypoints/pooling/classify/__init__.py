"""`/classify` (upstream: vllm/entrypoints/pooling/classify/)."""
