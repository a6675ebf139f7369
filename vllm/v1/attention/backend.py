"""The attention backend interface (upstream: vllm/v1/attention/backend.py).

A backend is three cooperating classes:
- `AttentionBackend`: static facts (name, KV cache shape, supported head sizes)
  and the two classes below;
- `AttentionMetadataBuilder`: turns the runner's `CommonAttentionMetadata`
  (one per KV cache group and step) into the backend's own metadata, once per
  step, so that the per-layer work stays small;
- `AttentionImpl`: the per-layer computation (write new K/V into the paged
  cache, then attend).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec


class AttentionType:
    """Which tokens a layer attends to (upstream string constants)."""

    DECODER = "decoder"  # causal self-attention over the decoder's tokens
    ENCODER = "encoder"
    ENCODER_ONLY = "encoder_only"
    ENCODER_DECODER = "encoder_decoder"


@dataclass
class CommonAttentionMetadata:
    """Backend-independent description of one step's batch for one KV cache group.

    Requests are laid out back to back in the flattened token dimension:
    request i owns tokens `query_start_loc[i]:query_start_loc[i + 1]`.
    """

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on the device
    query_start_loc_cpu: torch.Tensor  # [num_reqs + 1] int32
    seq_lens: torch.Tensor  # [num_reqs] int32: computed + scheduled tokens
    seq_lens_cpu: torch.Tensor  # [num_reqs] int32
    num_computed_tokens_cpu: torch.Tensor  # [num_reqs] int32: tokens already in the cache
    num_reqs: int
    num_actual_tokens: int  # tokens of real requests (the batch may be padded beyond)
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor  # [num_reqs, max_blocks_per_req] int32
    slot_mapping: torch.Tensor  # [num_tokens] int64; slot = block * block_size + offset
    causal: bool = True


class AttentionCGSupport(enum.Enum):
    """How far a backend's metadata and kernels can live inside a full CUDA
    graph (ordered: a larger value supports more batches)."""

    ALWAYS = 3  # any batch, prefills and mixed batches included
    UNIFORM_BATCH = 2  # batches whose requests all have the same query length
    UNIFORM_SINGLE_TOKEN_DECODE = 1  # pure decode batches (query length 1)
    NEVER = 0


M = TypeVar("M")


class AttentionMetadataBuilder(ABC, Generic[M]):
    """Builds a backend's metadata from `CommonAttentionMetadata`, once per step."""

    # When set, the model runner orders the batch so that requests whose query
    # length is <= this threshold (decodes) come first. A class default that
    # an instance may raise (see _init_reorder_batch_threshold).
    reorder_batch_threshold: int | None = None
    # Full CUDA graph support; a backend claims more only when its `build`
    # output lives at fixed addresses for a given padded batch size and its
    # kernels never synchronise with the host.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    @classmethod
    def get_cudagraph_support(
        cls, vllm_config: VllmConfig, kv_cache_spec: AttentionSpec
    ) -> AttentionCGSupport:
        return cls._cudagraph_support

    def __init__(
        self,
        kv_cache_spec: AttentionSpec,
        layer_names: list[str],
        vllm_config: VllmConfig,
        device: torch.device,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device

    def _init_reorder_batch_threshold(
        self, reorder_batch_threshold: int | None = 1, supports_spec_as_decode: bool = False
    ) -> None:
        """Set this builder's decode threshold (upstream's helper). A backend
        whose decode kernel takes several query tokens of one request as
        several decode rows ("spec-as-decode") raises it to 1 + the number of
        speculative tokens, so that the rows verifying drafts stay decodes."""
        self.reorder_batch_threshold = reorder_batch_threshold
        spec = self.vllm_config.speculative_config
        if (
            reorder_batch_threshold is not None
            and supports_spec_as_decode
            and spec is not None
            and spec.num_speculative_tokens is not None
        ):
            # parallel_drafting is refused, so a verify row holds 1 + k queries.
            self.reorder_batch_threshold = max(
                reorder_batch_threshold, 1 + spec.num_speculative_tokens
            )

    @abstractmethod
    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> M:
        """Backend metadata for this step. `common_prefix_len` is the number of
        tokens all requests share (cascade attention); backends may ignore it."""
        raise NotImplementedError

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> M:
        """Metadata for a capture run. The runner lays the dummy batch out in
        the same persistent buffers as real steps, so a plain build is right
        for backends whose `build` keeps those addresses."""
        return self.build(common_prefix_len=0, common_attn_metadata=common_attn_metadata)


class AttentionImpl(ABC, Generic[M]):
    """Per-layer attention computation over a paged KV cache."""

    @abstractmethod
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
    ) -> None:
        raise NotImplementedError

    @abstractmethod
    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: M,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [num_tokens, num_heads, head_size], key/value
        [num_tokens, num_kv_heads, head_size] -> output
        [num_tokens, num_heads, head_size] (written into `output` when given)."""
        raise NotImplementedError


class AttentionBackend(ABC):
    """Static description of one attention backend."""

    # The layer allocates the output and passes it to `AttentionImpl.forward`.
    accept_output_buffer: bool = True

    @staticmethod
    @abstractmethod
    def get_name() -> str:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def get_impl_cls() -> type[AttentionImpl]:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        raise NotImplementedError

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        cache_dtype_str: str = "auto",
    ) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor."""
        raise NotImplementedError

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        """Head sizes the backend supports; empty means any."""
        return []

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        supported = cls.get_supported_head_sizes()
        return not supported or head_size in supported
