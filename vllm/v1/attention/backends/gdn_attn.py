"""Step metadata for Gated DeltaNet layers (upstream:
vllm/v1/attention/backends/gdn_attn.py). A GDN layer needs what a Mamba-1
layer needs: each request's token range, state slot and whether the slot
already holds its earlier tokens' state."""

from __future__ import annotations

from vllm.v1.attention.backends.mamba1_attn import (
    Mamba1AttentionBackend,
    Mamba1AttentionMetadata,
    Mamba1AttentionMetadataBuilder,
)

GDNAttentionMetadata = Mamba1AttentionMetadata


class GDNAttentionMetadataBuilder(Mamba1AttentionMetadataBuilder):
    pass


class GDNAttentionBackend(Mamba1AttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "GDN_ATTN"

    @staticmethod
    def get_builder_cls() -> type[GDNAttentionMetadataBuilder]:
        return GDNAttentionMetadataBuilder
