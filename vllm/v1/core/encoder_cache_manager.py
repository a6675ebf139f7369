"""The encoder cache (upstream: vllm/v1/core/encoder_cache_manager.py).

Upstream caches the encoder outputs of multimodal items here. Multimodal inputs
are not built (requests with them are refused by the `InputProcessor` and the
`Scheduler`), so there is nothing to cache: constructing the manager is refused
with an error that says so rather than handing out a cache that is never used.
"""

from __future__ import annotations


class EncoderCacheManager:
    """Not built: see the module docstring."""

    def __init__(self, cache_size: int) -> None:
        raise NotImplementedError(
            f"EncoderCacheManager(cache_size={cache_size}): the encoder cache is not "
            "built, since multimodal inputs are not supported yet."
        )


class EncoderDecoderCacheManager:
    """Upstream's encoder-output cache for encoder-decoder models. Not built:
    encoder-decoder models are not supported."""

    def __init__(self, cache_size: int) -> None:
        raise NotImplementedError(
            f"EncoderDecoderCacheManager(cache_size={cache_size}): encoder-decoder "
            "models are not supported yet."
        )
