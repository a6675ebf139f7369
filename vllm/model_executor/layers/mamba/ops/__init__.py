"""Batched PyTorch ops for state-space layers (upstream:
vllm/model_executor/layers/mamba/ops/): causal conv, selective scan, and the
varlen batch layout they share."""
