"""compressed-tensors checkpoints (llm-compressor's format)
(upstream: vllm/model_executor/layers/quantization/compressed_tensors/)."""
