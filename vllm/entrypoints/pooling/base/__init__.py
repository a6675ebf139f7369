"""What the pooling routes share: input fields and their tokenization
(upstream: vllm/entrypoints/pooling/base/)."""
