"""Start-up pieces of the V1 runner (upstream: `load_model` and the
`initialize_kv_cache` helpers of vllm/v1/worker/gpu_model_runner.py, whose
`GPUModelRunner.load_model` / `initialize_kv_cache` call these).

Order matters when the model is loaded: LoRA layers go in before
torch.compile, and the CUDA graph wrapper comes last (at KV cache
initialisation, `CudaGraphManager.wrap_model`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
import torch.nn as nn

from vllm.logger import init_logger
from vllm.v1.worker import kv_cache_setup
from vllm.v1.worker.gpu_pooling import supported_pooling_tasks
from vllm.v1.worker.utils import (
    AttentionGroup,
    TextGenerationModel,
    as_text_generation_model,
    get_model_config,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

logger = init_logger(__name__)


def load_target_model(
    vllm_config: VllmConfig,
    device: torch.device,
    add_lora: Callable[[nn.Module], nn.Module] | None,
    is_pooling_model: bool,
) -> tuple[nn.Module, TextGenerationModel, int]:
    """Load the target model: (the module as loaded, LoRA layers in and maybe
    compiled; the same as the runner's typed model; its weights' bytes as
    loaded, quantized ones at their packed size)."""
    from vllm.compilation.decorators import maybe_compile_model
    from vllm.model_executor.model_loader import get_model

    logger.info("Loading model %s on %s", get_model_config(vllm_config).model, device)
    model = get_model(vllm_config=vllm_config)
    weight_bytes: int = getattr(model, "model_weight_bytes", 0)
    if add_lora is not None:
        # LoRA layers go in before torch.compile and the graph wrapper.
        model = add_lora(model)
    # No-op unless compilation_config.mode asks for torch.compile (on
    # CPU it measured slower than eager: see vllm/compilation/decorators.py).
    model = maybe_compile_model(
        model, vllm_config.compilation_config, device, vllm_config=vllm_config
    )
    if is_pooling_model:
        supported_pooling_tasks(model)  # raises when the model has no pooler
        return model, cast(TextGenerationModel, model), weight_bytes
    return model, as_text_generation_model(model), weight_bytes


def kv_block_sizes(kv_cache_config: KVCacheConfig) -> list[int]:
    """The block size of every KV cache group that has a cache (one block
    table per group in the persistent batch)."""
    return [
        g.kv_cache_spec.block_size
        for g in kv_cache_config.kv_cache_groups
        if not kv_cache_setup.is_cacheless_group(g.kv_cache_spec)
    ]


def reorder_batch_threshold(attn_groups: list[list[AttentionGroup]]) -> int | None:
    """The smallest query length any attention backend still treats as a
    decode (None when no backend reorders the batch)."""
    thresholds = [
        threshold
        for groups in attn_groups
        for g in groups
        if (threshold := g.metadata_builder.reorder_batch_threshold) is not None
    ]
    return min(thresholds) if thresholds else None
