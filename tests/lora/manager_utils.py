"""Shared by the LoRA manager tests: our tiny Llama built through the model
loader with its LoRA layers in place (no engine), peft adapters for it, and
the reference logits of transformers' merged peft model."""

from __future__ import annotations

import os

import torch

from tests.lora.peft_utils import make_peft_adapter
from tests.model_executor.paged_harness import PagedHarness
from vllm.config.lora import LoRAConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.lora.layers import LoRAMapping
from vllm.lora.request import LoRARequest
from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager, WorkerLoRAManager
from vllm.model_executor.model_loader import get_model

MAX_RANK = 16


def build_adapters(
    base_dir: str, out_dir: str, specs: dict[str, tuple[int, int]], **kwargs
) -> dict[str, str]:
    """name -> adapter dir, for specs name -> (rank, seed); random A and B
    (kwargs: peft LoraConfig options, e.g. target_modules)."""
    paths = {}
    for name, (rank, seed) in specs.items():
        path = os.path.join(out_dir, name)
        make_peft_adapter(base_dir, path, r=rank, lora_alpha=2 * rank, seed=seed, **kwargs)
        paths[name] = path
    return paths


def lora_model_and_worker(
    base_dir: str,
    max_loras: int,
    max_cpu_loras: int,
    lru: bool = True,
    **lora_kwargs,
):
    """(model with LoRA layers, worker manager, vllm_config) for our Llama."""
    config = EngineArgs(
        model=base_dir, dtype="float32", block_size=8, device="cpu"
    ).create_engine_config()
    config.lora_config = LoRAConfig(  # type: ignore[misc]
        max_lora_rank=MAX_RANK,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        lora_dtype=torch.float32,
        **lora_kwargs,
    )
    model = get_model(vllm_config=config)
    cls = LRUCacheWorkerLoRAManager if lru else WorkerLoRAManager
    worker = cls(config, torch.device("cpu"), model.embedding_modules)
    model = worker.create_lora_manager(model, config)
    return model, worker, config


def request(name: str, lora_id: int, path: str, **kwargs) -> LoRARequest:
    return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path, **kwargs)


def run_step(
    model,
    config,
    worker,
    batch: list[tuple[list[int], LoRARequest | None]],
) -> list[torch.Tensor]:
    """Prefill each prompt (fresh requests) in one step, each token under its
    prompt's adapter (None: base model); returns each prompt's logits."""
    requests = {r for _, r in batch if r is not None}
    index_mapping = [0 if r is None else r.lora_int_id for tokens, r in batch for _ in tokens]
    mapping = LoRAMapping(index_mapping, index_mapping, is_prefill=True)
    worker.set_active_adapters(requests, mapping)
    harness = PagedHarness(model, config)
    return harness.step([(f"req{i}", tokens) for i, (tokens, _) in enumerate(batch)])


def merged_peft_logits(base_dir: str, adapter_dir: str | None, tokens: list[int]) -> torch.Tensor:
    """transformers' logits of `PeftModel.from_pretrained(base, adapter).merge_and_unload()`
    (the base model when adapter_dir is None), float32."""
    import transformers as tf
    from peft import PeftModel

    model = tf.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload().eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]
