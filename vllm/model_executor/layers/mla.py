"""The multi-head latent attention layer (upstream: `MLAAttention` in
vllm/attention/layer.py with vllm/model_executor/layers/mla.py).

Like `Attention`, the layer registers itself in the static forward context
under its prefix, declares its KV cache (`MLAAttentionSpec`: one latent row of
kv_lora_rank + qk_rope_head_dim per token) and reads its metadata from the
forward context. The math lives in the backend (backends/mla/cpu_mla.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
from vllm.v1.kv_cache_interface import KVCacheSpec, MLAAttentionSpec

if TYPE_CHECKING:
    from vllm.config import CacheConfig, VllmConfig


class LatentUpProjection(ColumnParallelLinear):
    """kv_b_proj: latent [L] -> per head [k_nope; v]. MLA never applies it as
    a GEMM (its weight is absorbed into the query and the output), so its
    weight stays dense instead of being repacked after loading."""

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        return None


class MLAAttention(nn.Module):
    """forward: q [T, H * (N + R)] (rope applied to its last R dims per head),
    kv_c_normed [T, L], k_pe [T, R] (rope applied) -> [T, H * V]."""

    def __init__(
        self,
        num_heads: int,
        scale: float,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        kv_b_proj: LatentUpProjection,
        cache_config: CacheConfig | None = None,
        quant_config: Any = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError("Quantized MLA is not built.")
        vllm_config = get_current_vllm_config()
        cache_config = cache_config or vllm_config.cache_config
        if cache_config.cache_dtype != "auto":
            raise NotImplementedError("MLA needs kv_cache_dtype='auto'.")
        self.num_heads = num_heads
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.head_size = kv_lora_rank + qk_rope_head_dim  # the cached row
        self.layer_name = prefix
        self.dtype = torch.get_default_dtype()
        self.kv_cache_dtype = cache_config.cache_dtype
        self.attn_backend = CPUMLABackend
        self.impl = CPUMLABackend.get_impl_cls()(
            num_heads,
            self.head_size,
            scale,
            1,
            None,
            None,
            self.kv_cache_dtype,
            q_lora_rank=q_lora_rank,
            kv_lora_rank=kv_lora_rank,
            qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim,
            qk_head_dim=self.qk_head_dim,
            v_head_dim=v_head_dim,
            kv_b_proj=kv_b_proj,
        )
        vllm_config.compilation_config.register_stateful_layer(prefix, self, "MLA")
        self.kv_cache: list[torch.Tensor] = [
            torch.tensor([]) for _ in range(vllm_config.parallel_config.pipeline_parallel_size)
        ]

    def forward(
        self, q: torch.Tensor, kv_c_normed: torch.Tensor, k_pe: torch.Tensor
    ) -> torch.Tensor:
        ctx = get_forward_context()
        num_tokens = q.shape[0]
        attn_metadata = ctx.attn_metadata[self.layer_name] if ctx.attn_metadata else None
        if attn_metadata is None:  # dummy / profiling run
            return q.new_zeros(num_tokens, self.num_heads * self.v_head_dim)
        output = torch.empty(
            num_tokens, self.num_heads * self.v_head_dim, dtype=q.dtype, device=q.device
        )
        return self.impl.forward(
            self,
            q.view(num_tokens, self.num_heads, self.qk_head_dim),
            kv_c_normed,
            k_pe,
            self.kv_cache[ctx.virtual_engine],
            attn_metadata,
            output=output,
        )

    def get_attn_backend(self) -> type[CPUMLABackend]:
        return self.attn_backend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec:
        dtype = (
            self.dtype
            if self.kv_cache_dtype == "auto"
            else STR_DTYPE_TO_TORCH_DTYPE[self.kv_cache_dtype]
        )
        return MLAAttentionSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=1,
            head_size=self.head_size,
            dtype=dtype,
            cache_dtype_str=self.kv_cache_dtype,
        )
