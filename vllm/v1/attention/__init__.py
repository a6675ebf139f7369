"""Attention backends of the V1 engine (upstream: vllm/v1/attention/).

`backend.py`: the ABCs (`AttentionBackend`, `AttentionImpl`,
`AttentionMetadataBuilder`), `CommonAttentionMetadata` (what every builder
starts from) and `AttentionCGSupport` (the CUDA graph modes a backend
allows). `selector.py`: the backend for a layer, by device, dtype and
`--attention-backend` / VLLM_ATTENTION_BACKEND. `backends/`: CPU paged
attention, Triton unified attention (GPU; interpreter-tested on CPU),
FlashInfer (optional), MLA, Mamba-1 and gated-delta-net state backends.
`ops/`: the Triton kernels.
"""
