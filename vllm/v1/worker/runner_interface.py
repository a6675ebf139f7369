"""What a worker needs of its model runner (a protocol of ours; upstream's
worker names the V1 `GPUModelRunner` class).

The worker (vllm/v1/worker/gpu_worker.py) drives steps, warm-up, memory
profiling and graph capture through it, and its sleep mode
(vllm/v1/worker/worker_sleep.py) drops and rebuilds the KV cache. The V1
(vllm/v1/worker/gpu_model_runner.py) and V2 (vllm/v1/worker/gpu/model_runner.py)
`GPUModelRunner` are both one; this module imports neither (.importlinter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.sequence import IntermediateTensors
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, ModelRunnerOutput
    from vllm.v1.worker.utils import AttentionGroup, LayerKVCache


class ModelRunner(Protocol):
    """What the worker (steps, warm-up, memory profiling) and its sleep mode
    (vllm/v1/worker/worker_sleep.py) use of a model runner."""

    device: torch.device
    max_model_len: int
    max_num_reqs: int
    max_num_tokens: int
    kv_cache_config: KVCacheConfig | None
    kv_caches: list[LayerKVCache]
    attn_groups: list[list[AttentionGroup]]

    def load_model(self) -> None: ...

    def get_model(self) -> nn.Module: ...

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]: ...

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None: ...

    def profile_run(self) -> None: ...

    def capture_model(self) -> int: ...

    def _dummy_run(
        self, num_tokens: int, use_kv_cache: bool = True, num_reqs: int | None = None
    ) -> torch.Tensor: ...

    def _dummy_sampler_run(self, hidden_states: torch.Tensor) -> None: ...

    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> ModelRunnerOutput | IntermediateTensors | None: ...

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None: ...

    # LoRA (vllm/v1/worker/lora_model_runner_mixin.py)
    def add_lora(self, lora_request: LoRARequest) -> bool: ...

    def remove_lora(self, lora_id: int) -> bool: ...

    def pin_lora(self, lora_id: int) -> bool: ...

    def list_loras(self) -> set[int]: ...

    def take_draft_token_ids(self) -> DraftTokenIds | None: ...
