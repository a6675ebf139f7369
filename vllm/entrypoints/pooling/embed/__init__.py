"""`/v1/embeddings` (upstream: vllm/entrypoints/pooling/embed/)."""
