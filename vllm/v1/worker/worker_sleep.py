"""Sleep mode on one worker: give back the memory of the KV cache and of the
weights, and take it again on wake-up (`Worker.sleep` / `Worker.wake_up`).

Upstream does this with its CUDA allocator (vllm/device_allocator/cumem.py):
allocations made under a tag ("weights", "kv_cache") have their physical
memory unmapped while their virtual addresses stay reserved, so captured
CUDA graphs remain valid. Level 1 copies the "weights" to host memory first
and discards the KV cache; level 2 discards both (buffers such as rope
caches are kept).

This build has no such allocator; it drops the tensors and builds them again:

- "kv_cache": every reference to the KV cache tensors (the layers'
  `kv_cache`, the runner's `kv_caches`) is dropped, so the memory goes back
  to the allocator (on CPU to the OS: each cache tensor is one large
  allocation). Waking up allocates them again, zero-filled, from the runner's
  `KVCacheConfig` and attention groups. The content is forgotten, as upstream:
  the engine core resets the prefix cache when it goes to sleep.
- "weights", level 1: on an accelerator the weight tensors are copied to host
  memory and back on wake-up. On CPU they already live in host memory, where
  level 1 leaves them, as upstream's level 1 does.
- "weights", level 2: every parameter's storage (and the tensors modules
  keep next to their parameters, e.g. the CPU-packed GEMM weights) is freed.
  Upstream leaves the content undefined after wake-up and expects the caller
  to load weights; here wake-up builds the model again from the checkpoint
  with the start-up loader and moves the fresh tensors into the existing
  modules (parameters keep their identity, so every holder of a module - the
  runner, the forward context's attention layers - sees the reloaded weights).

What cannot work this way is refused before anything is freed: a model
running under CUDA graphs (the graphs hold the tensors' addresses), and level
2 of a torch.compile'd model (the compiled graph may keep frozen weights).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from vllm.config.compilation import CompilationMode, CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.worker import kv_cache_setup

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.runner_interface import ModelRunner

logger = init_logger(__name__)

SLEEP_TAGS = ("weights", "kv_cache")


def check_wake_up_tags(tags: list[str] | None) -> None:
    """ValueError for a tag that names no memory a worker gives back."""
    unknown = sorted(set(tags or ()) - set(SLEEP_TAGS))
    if unknown:
        raise ValueError(f"Unknown wake-up tags {unknown}; the tags are {list(SLEEP_TAGS)}.")


def check_sleep_supported(vllm_config: VllmConfig, level: int) -> None:
    """Raise (before anything is freed) where this build cannot sleep."""
    compilation = vllm_config.compilation_config
    if compilation.cudagraph_mode not in (None, CUDAGraphMode.NONE):
        raise ValueError(
            "Sleep mode with CUDA graphs needs upstream's cumem allocator (graphs keep the "
            "addresses of the tensors sleep frees), which is not built: run with "
            "--enforce-eager to use sleep mode."
        )
    if level == 2 and vllm_config.lora_config is not None:
        raise ValueError(
            "Sleep level 2 reloads the base weights on wake-up, which does not reach the "
            "LoRA layers wrapping them (--enable-lora): use level 1."
        )
    if level == 2 and compilation.mode != CompilationMode.NONE:
        raise ValueError(
            "Sleep level 2 reloads the weights on wake-up, which a torch.compile'd model "
            f"(compilation mode {compilation.mode}) would not see: use level 1, or "
            "compilation mode 0."
        )


# ---- KV cache ----------------------------------------------------------------------
def discard_kv_cache(runner: ModelRunner, vllm_config: VllmConfig) -> None:
    """Drop every reference to the KV cache tensors."""
    num_engines = vllm_config.parallel_config.pipeline_parallel_size
    for layer in vllm_config.compilation_config.static_forward_context.values():
        if hasattr(layer, "kv_cache"):
            layer.kv_cache = [torch.tensor([]) for _ in range(num_engines)]
    runner.kv_caches = []


def reallocate_kv_cache(runner: ModelRunner, vllm_config: VllmConfig) -> None:
    """Allocate the KV cache again (zero-filled) and bind it to the layers."""
    if runner.kv_cache_config is None:
        raise RuntimeError("The KV cache was never initialised: nothing to wake up.")
    runner.kv_caches = kv_cache_setup.allocate_and_bind_kv_caches(
        runner.kv_cache_config, runner.attn_groups, vllm_config, runner.device
    )


# ---- weights -----------------------------------------------------------------------
def _weight_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's own weight tensors: parameters, and the plain tensor
    attributes kept next to them (packed GEMM weights). Buffers are not
    weights (upstream keeps them too)."""
    tensors: dict[str, torch.Tensor] = {
        name: p for name, p in module._parameters.items() if p is not None
    }
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            tensors[name] = value
    return tensors


def offload_weights(model: nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """Level 1 on an accelerator: move the weights to host memory. Returns
    the host copies of the plain tensor attributes (parameters move in place)."""
    host: dict[tuple[str, str], torch.Tensor] = {}
    for mod_name, module in model.named_modules():
        for name, tensor in _weight_tensors(module).items():
            if isinstance(tensor, nn.Parameter):
                tensor.data = tensor.data.to("cpu")
            else:
                host[(mod_name, name)] = tensor.to("cpu")
                setattr(module, name, None)
    return host


def onload_weights(
    model: nn.Module, host: dict[tuple[str, str], torch.Tensor], device: torch.device
) -> None:
    """Undo `offload_weights`."""
    modules = dict(model.named_modules())
    for module in modules.values():
        for p in module._parameters.values():
            if p is not None and p.device != device:
                p.data = p.data.to(device)
    for (mod_name, name), tensor in host.items():
        setattr(modules[mod_name], name, tensor.to(device))


def discard_weights(model: nn.Module) -> None:
    """Level 2: free the storage of every weight tensor (parameters keep
    their identity, with an empty tensor until `reload_weights`)."""
    for module in model.modules():
        for name, tensor in _weight_tensors(module).items():
            if isinstance(tensor, nn.Parameter):
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            else:
                setattr(module, name, None)


def reload_weights(model: nn.Module, vllm_config: VllmConfig) -> None:
    """Build the model again from the checkpoint (the start-up loader) and
    move its weight tensors into `model`'s modules."""
    from vllm.model_executor.model_loader import get_model

    # The fresh model's attention layers register under the same names as
    # the live ones: build it against an empty forward context, then put
    # the live layers (which keep their KV cache binding) back.
    static_ctx = vllm_config.compilation_config.static_forward_context
    live_layers = dict(static_ctx)
    static_ctx.clear()
    try:
        fresh = get_model(vllm_config=vllm_config)
    finally:
        static_ctx.clear()
        static_ctx.update(live_layers)
    old_modules = dict(model.named_modules())
    new_modules = dict(fresh.named_modules())
    if old_modules.keys() != new_modules.keys():
        raise RuntimeError("The reloaded model's modules differ from the sleeping model's.")
    for name, old in old_modules.items():
        new = new_modules[name]
        for attr, tensor in _weight_tensors(new).items():
            if isinstance(tensor, nn.Parameter):
                old._parameters[attr].data = tensor.data  # type: ignore[union-attr]
            else:
                setattr(old, attr, tensor)
        # Modules without weights of their own (a rope cache rebuilt on
        # load, say) keep what they had: it was never freed.
