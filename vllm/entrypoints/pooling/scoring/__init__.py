"""`/score` and `/rerank` (upstream: vllm/entrypoints/pooling/scoring/)."""
