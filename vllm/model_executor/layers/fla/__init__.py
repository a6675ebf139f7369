"""Linear-attention ops after the flash-linear-attention library (upstream:
vllm/model_executor/layers/fla/), here in batched PyTorch."""
