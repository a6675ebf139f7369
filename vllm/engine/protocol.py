"""What the API server needs from an engine (upstream: vllm/engine/protocol.py).

`AsyncLLM` implements it; the OpenAI serving classes only talk to this.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.inputs import PromptType
    from vllm.lora.request import LoRARequest
    from vllm.outputs import PoolingRequestOutput, RequestOutput
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers import TokenizerLike


class EngineClient(ABC):
    """Protocol class for clients of the engine."""

    vllm_config: VllmConfig
    model_config: ModelConfig

    @property
    @abstractmethod
    def is_running(self) -> bool:
        """The engine accepts and runs requests."""

    @property
    @abstractmethod
    def is_stopped(self) -> bool:
        """The engine was shut down or failed."""

    @property
    @abstractmethod
    def errored(self) -> bool:
        """The engine hit an unrecoverable error (see `dead_error`)."""

    @property
    @abstractmethod
    def dead_error(self) -> BaseException:
        """The exception every request gets once the engine errored."""

    @abstractmethod
    def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Generate outputs for one request; cancelling the generator aborts it.

        `reasoning_ended` / `reasoning_parser_kwargs`: see
        `vllm.v1.structured_output.StructuredOutputManager` (where a grammar
        starts with a reasoning parser)."""

    @abstractmethod
    def encode(
        self,
        prompt: PromptType,
        pooling_params: PoolingParams,
        request_id: str,
        lora_request: LoRARequest | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> AsyncGenerator[PoolingRequestOutput[Any], None]:
        """Run one pooling request; yields its single, final output."""

    @abstractmethod
    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort request(s) by the id given to `generate`."""

    @abstractmethod
    async def get_tokenizer(self) -> TokenizerLike:
        """The tokenizer of the served model."""

    @abstractmethod
    async def is_tracing_enabled(self) -> bool: ...

    @abstractmethod
    async def do_log_stats(self) -> None:
        """Emit the periodic stats log line."""

    @abstractmethod
    async def check_health(self) -> None:
        """Raise if the engine is unhealthy."""

    @abstractmethod
    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """Drop the prefix cache."""

    @abstractmethod
    async def get_supported_tasks(self) -> tuple[str, ...]:
        """Tasks of the served model ("generate", ...)."""

    @abstractmethod
    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Sleep mode: pause scheduling; the requests in flight are aborted
        (mode "abort"), finished first ("wait") or kept for wake_up ("keep").
        Level 1 gives back the KV cache's memory, level 2 the weights' too."""

    @abstractmethod
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: all)."""

    @abstractmethod
    async def is_sleeping(self) -> bool:
        """Whether the engine is asleep (or partly so)."""

    @abstractmethod
    async def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a new LoRA adapter into the engine for future requests."""

    @abstractmethod
    async def remove_lora(self, lora_id: int) -> bool:
        """Remove an already loaded LoRA adapter."""

    @abstractmethod
    async def list_loras(self) -> set[int]:
        """List all registered adapters."""

    @abstractmethod
    async def pin_lora(self, lora_id: int) -> bool:
        """Prevent an adapter from being evicted."""
