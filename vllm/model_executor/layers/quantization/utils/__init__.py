"""Helpers shared by the quantization methods (upstream:
vllm/model_executor/layers/quantization/utils/)."""
