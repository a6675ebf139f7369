"""`/pooling` (upstream: vllm/entrypoints/pooling/pooling/)."""
