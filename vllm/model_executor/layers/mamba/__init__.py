"""State-space (Mamba) layers (upstream: vllm/model_executor/layers/mamba/)."""
