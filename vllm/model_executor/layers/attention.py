"""The attention layer models use (upstream: vllm/attention/layer.py `Attention`).

At construction the layer registers itself under its prefix in
`compilation_config.static_forward_context` (how the model runner finds the
attention layers), picks its backend and builds the backend's impl. The runner
later binds the layer's KV cache (`layer.kv_cache = [tensor]`, one per virtual
engine) and, each step, passes metadata through the forward context.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.attention.backend import AttentionBackend, AttentionType
from vllm.v1.attention.selector import get_attn_backend
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

if TYPE_CHECKING:
    from vllm.config import CacheConfig, VllmConfig


class Attention(nn.Module):
    """Multi-head / grouped-query attention over the paged KV cache.

    forward: query [T, num_heads * head_size], key/value [T, num_kv_heads * head_size]
    (already rotated) -> output [T, num_heads * head_size].
    """

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        cache_config: CacheConfig | None = None,
        quant_config: Any = None,
        logits_soft_cap: float | None = None,
        per_layer_sliding_window: int | None = None,
        prefix: str = "",
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
    ) -> None:
        super().__init__()
        # quant_config carries a checkpoint's KV-cache scheme upstream; every
        # method built here refuses one when its config is parsed
        # (compressed-tensors: kv_cache_scheme), so the cache stays unquantized.
        if quant_config is not None and getattr(quant_config, "kv_cache_scheme", None):
            raise NotImplementedError("Quantized KV caches from the checkpoint are not built.")
        if not prefix:
            raise ValueError("Attention layers need a unique, non-empty prefix.")
        vllm_config = get_current_vllm_config()
        cache_config = cache_config or vllm_config.cache_config
        self.num_heads = num_heads
        self.head_size = head_size
        self.num_kv_heads = num_kv_heads or num_heads
        self.scale = scale
        self.sliding_window = per_layer_sliding_window
        self.attn_type = attn_type
        self.layer_name = prefix
        self.kv_cache_dtype = cache_config.cache_dtype
        self.dtype = torch.get_default_dtype()  # the model dtype while it is being built
        self.kv_cache_torch_dtype = (
            self.dtype
            if self.kv_cache_dtype == "auto"
            else STR_DTYPE_TO_TORCH_DTYPE[self.kv_cache_dtype]
        )
        self.attn_backend = get_attn_backend(
            head_size, self.dtype, self.kv_cache_dtype, cache_config.block_size
        )
        self.impl = self.attn_backend.get_impl_cls()(
            num_heads,
            head_size,
            scale,
            self.num_kv_heads,
            alibi_slopes,
            self.sliding_window,
            self.kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
        )
        static_ctx = vllm_config.compilation_config.static_forward_context
        if prefix in static_ctx:
            raise ValueError(f"Duplicate layer name: {prefix}")
        static_ctx[prefix] = self
        # One (empty until bound) cache per pipeline-parallel virtual engine.
        self.kv_cache: list[torch.Tensor] = [
            torch.tensor([]) for _ in range(vllm_config.parallel_config.pipeline_parallel_size)
        ]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        self.forward_into(query, key, value, output)
        return output

    def forward_into(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor
    ) -> None:
        """`forward` writing into `output` [T, num_heads * head_size] (what the
        compiled graphs call: the buffer is allocated inside the piece before
        attention, so a piecewise CUDA graph owns it; see compilation/backends.py)."""
        ctx = get_forward_context()
        num_tokens = query.shape[0]
        attn_metadata = None
        if ctx.attn_metadata is not None:
            attn_metadata = ctx.attn_metadata[self.layer_name]
        if attn_metadata is None:
            # Dummy / profiling run: the shapes and memory of a real step, no cache traffic.
            output.zero_()
            return
        self.impl.forward(
            self,
            query.view(num_tokens, self.num_heads, self.head_size),
            key.view(num_tokens, self.num_kv_heads, self.head_size),
            value.view(num_tokens, self.num_kv_heads, self.head_size),
            self.kv_cache[ctx.virtual_engine],
            attn_metadata,
            output=output.view(num_tokens, self.num_heads, self.head_size),
        )

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.attn_backend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        """The KV cache this layer needs: a sliding-window spec for windowed layers."""
        block_size = vllm_config.cache_config.block_size
        if self.sliding_window is not None:
            return SlidingWindowSpec(
                block_size=block_size,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                dtype=self.kv_cache_torch_dtype,
                sliding_window=self.sliding_window,
            )
        return FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            dtype=self.kv_cache_torch_dtype,
        )

    def extra_repr(self) -> str:
        return (
            f"head_size={self.head_size}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, scale={self.scale}, "
            f"backend={self.attn_backend.get_name()}"
        )
