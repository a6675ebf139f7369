"""Model execution: layers, model definitions and weight loaders
(upstream: vllm/model_executor/)."""
