"""KV cache configuration (upstream: vllm/config/cache.py)."""

from __future__ import annotations

from dataclasses import dataclass

_HASH_ALGOS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


@dataclass
class CacheConfig:
    """How the paged KV cache is laid out and sized."""

    block_size: int = 16  # tokens per KV block
    gpu_memory_utilization: float = 0.92  # GPU: fraction of device memory for vLLM
    cache_dtype: str = "auto"  # "auto" = the model dtype
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    # Exact KV cache size in bytes; overrides gpu_memory_utilization (and, on
    # CPU, VLLM_CPU_KVCACHE_SPACE).
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None

    def __post_init__(self) -> None:
        if self.block_size is None:
            self.block_size = 16
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, got {self.block_size}.")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"GPU memory utilization must be within (0, 1]. Got {self.gpu_memory_utilization}."
            )
        if self.prefix_caching_hash_algo not in _HASH_ALGOS:
            raise ValueError(
                f"prefix_caching_hash_algo must be one of {_HASH_ALGOS}, got "
                f"{self.prefix_caching_hash_algo!r}."
            )
        if self.cache_dtype != "auto":
            raise ValueError(
                f"kv_cache_dtype {self.cache_dtype!r} is not supported yet; "
                "only 'auto' (the model dtype) is."
            )
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be positive.")
        # Filled in by the engine core once the KV cache is sized.
        self.num_gpu_blocks: int | None = None
        self.num_cpu_blocks: int | None = None
