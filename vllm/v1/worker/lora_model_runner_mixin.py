"""LoRA for the model runners (upstream: vllm/v1/worker/lora_model_runner_mixin.py).

Both the V1 runner (vllm/v1/worker/gpu_model_runner.py) and Model Runner V2
(vllm/v1/worker/gpu/model_runner.py) inherit `LoRAModelRunnerMixin`; this
module imports neither (.importlinter: shared worker modules).

Per step, before the forward, the runner hands the worker LoRA manager a
`LoRAMapping` in the step's token order:
  index_mapping[t]   the LoRA id (`lora_int_id`, 0 = base model) of batch token t;
  prompt_mapping[s]  the LoRA id of logits row s (one per sampled row).
For the batch [req0: 3 tokens of adapter 7, req1: 1 token, base model]:
  index_mapping = (7, 7, 7, 0)   prompt_mapping = (7, 0)
The manager loads / activates the step's adapters into slots (an adapter
active in the step is never evicted) and the Punica wrapper turns ids into
slots for the LoRA layers.

Dummy runs (profiling, warm-up, CUDA graph capture) run with no adapter: every
token maps to 0. Graphs are captured with the LoRA layers in the model but no
adapter active, so the runners replay them only for steps without adapters
(`BatchDescriptor.has_lora`) and run steps with adapters eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch.nn as nn

from vllm.config.compilation import CompilationMode
from vllm.logger import init_logger
from vllm.lora.layers import LoRAMapping, LoRAMappingType

if TYPE_CHECKING:
    import torch

    from vllm.config import VllmConfig
    from vllm.config.lora import LoRAConfig
    from vllm.lora.request import LoRARequest
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager

logger = init_logger(__name__)

# (logits-row ids, token ids, the step's adapters: one LoRARequest per id).
LoRAInputs = tuple[tuple[int, ...], tuple[int, ...], "Collection[LoRARequest]"]


class LoRAInputBatch(Protocol):
    """What `set_active_loras` needs of a persistent batch (V1's InputBatch)."""

    def make_lora_inputs(
        self, num_scheduled_tokens: np.ndarray, num_sampled_tokens: np.ndarray
    ) -> LoRAInputs: ...


class LoRAModelRunnerMixin:
    """LoRA state of a model runner: the worker LoRA manager, the step's mapping."""

    lora_config: LoRAConfig | None
    get_model: Callable[[], nn.Module]

    def load_lora_model(
        self, model: nn.Module, vllm_config: VllmConfig, device: torch.device
    ) -> nn.Module:
        """Replace the model's supported layers with LoRA layers (called by
        load_model, before torch.compile or any CUDA graph wrapping)."""
        from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
        from vllm.model_executor.models import supports_lora

        if not supports_lora(model):
            raise ValueError(f"{model.__class__.__name__} does not support LoRA yet.")
        mode = vllm_config.compilation_config.mode
        if mode != CompilationMode.NONE:
            # Measured: Inductor fails on the CPU wrapper's per-step plans
            # (unbacked sizes); the GPU wrapper is not checked under compile.
            raise NotImplementedError(
                f"enable_lora (--enable-lora) with compilation_config.mode={mode.name}: the "
                "LoRA layers are not torch.compile-able in this build; use compilation mode "
                "NONE (the default)."
            )
        # SupportsLoRA: module-name suffix -> "input_embeddings" / "output_embeddings".
        embedding_modules: dict[str, str] = getattr(model, "embedding_modules", {})
        self.lora_manager: LRUCacheWorkerLoRAManager = LRUCacheWorkerLoRAManager(
            vllm_config, device, embedding_modules
        )
        # The last mapping handed over (prompt-logprob rows re-use its tokens).
        self._lora_step: tuple[tuple[int, ...], Collection[LoRARequest]] | None = None
        return self.lora_manager.create_lora_manager(model, vllm_config)

    def _ensure_lora_enabled(self) -> None:
        if not hasattr(self, "lora_manager"):
            raise RuntimeError("LoRA is not enabled. Use --enable-lora to enable LoRA.")

    def _set_active_loras(
        self,
        prompt_lora_mapping: tuple[int, ...],
        token_lora_mapping: tuple[int, ...],
        lora_requests: Collection[LoRARequest],
        mapping_type: LoRAMappingType = LoRAMappingType.LANGUAGE,
    ) -> None:
        """Activate `lora_requests` (loading any not yet loaded; one per
        lora_int_id: a set would merge two loads of one name, as LoRARequests
        compare by name) and hand the Punica wrapper the mapping.
        is_prefill=True: the CPU wrapper then uses its segment (sgmv) path
        for every step, as upstream."""
        self._ensure_lora_enabled()
        mapping = LoRAMapping(
            token_lora_mapping, prompt_lora_mapping, is_prefill=True, type=mapping_type
        )
        self.lora_manager.set_active_adapters(lora_requests, mapping)
        self._lora_step = (mapping.index_mapping, lora_requests)

    def set_active_loras(
        self,
        input_batch: LoRAInputBatch,
        num_scheduled_tokens: np.ndarray,
        num_sampled_tokens: np.ndarray | None = None,
        mapping_type: LoRAMappingType = LoRAMappingType.LANGUAGE,
    ) -> None:
        """The step's mapping from the persistent batch: request i's id
        repeated num_scheduled_tokens[i] times (tokens) and
        num_sampled_tokens[i] times (logits rows; default one each)."""
        if num_sampled_tokens is None:
            num_sampled_tokens = np.ones_like(num_scheduled_tokens, dtype=np.int32)
        prompt_mapping, token_mapping, requests = input_batch.make_lora_inputs(
            num_scheduled_tokens, num_sampled_tokens
        )
        self._set_active_loras(prompt_mapping, token_mapping, requests, mapping_type)

    def set_lora_logits_rows(self, lora_ids: np.ndarray) -> None:
        """Re-key the logits rows of the current step (its token mapping and
        adapters unchanged): row s of the next compute_logits gets adapter
        lora_ids[s]. Prompt logprobs compute logits over a request's prompt
        tokens, a row count the step's mapping does not describe."""
        assert self._lora_step is not None, "no step mapping to re-key"
        token_mapping, requests = self._lora_step
        self._set_active_loras(tuple(lora_ids.tolist()), token_mapping, requests)

    @contextmanager
    def maybe_dummy_run_with_lora(
        self,
        lora_config: LoRAConfig | None,
        num_scheduled_tokens: np.ndarray,
        num_sampled_tokens: np.ndarray | None = None,
        remove_lora: bool = True,
        num_active_loras: int = 0,
    ) -> Iterator[None]:
        """A dummy run (profile, warm-up, graph capture) with no adapter: every
        token and logits row maps to the base model. No dummy adapter is
        loaded, so there is nothing to remove (`remove_lora`) and the adapters
        a user added stay. Upstream's dummy adapters (`num_active_loras` > 0,
        for graphs specialised per adapter count) are not built."""
        if num_active_loras:
            raise NotImplementedError(
                f"num_active_loras={num_active_loras}: dummy runs with dummy LoRA adapters "
                "are not built; dummy runs map every token to the base model."
            )
        if lora_config is not None:
            self.set_dummy_loras(num_scheduled_tokens, num_sampled_tokens)
        yield

    def set_dummy_loras(
        self, num_scheduled_tokens: np.ndarray, num_sampled_tokens: np.ndarray | None = None
    ) -> None:
        """The no-adapter mapping for a dummy batch of these request sizes."""
        num_tokens = int(np.sum(num_scheduled_tokens))
        num_rows = len(num_scheduled_tokens)
        if num_sampled_tokens is not None:
            num_rows = int(np.sum(num_sampled_tokens))
        self._set_active_loras((0,) * num_rows, (0,) * num_tokens, ())

    def maybe_remove_all_loras(self, lora_config: LoRAConfig | None) -> None:
        if lora_config is not None:
            self.lora_manager.remove_all_adapters()

    # ---- the worker's LoRA calls (collective_rpc targets) ----------------------------
    def add_lora(self, lora_request: LoRARequest) -> bool:
        self._ensure_lora_enabled()
        return self.lora_manager.add_adapter(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        self._ensure_lora_enabled()
        return self.lora_manager.remove_adapter(lora_id)

    def pin_lora(self, lora_id: int) -> bool:
        self._ensure_lora_enabled()
        return self.lora_manager.pin_adapter(lora_id)

    def list_loras(self) -> set[int]:
        self._ensure_lora_enabled()
        return self.lora_manager.list_adapters()
