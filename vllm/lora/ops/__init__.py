"""Batched multi-LoRA ops (upstream: vllm/lora/ops/): `torch_ops` for CPU,
`triton_ops` for GPU (and for CPU tensors under TRITON_INTERPRET=1)."""
