"""The synchronous engine behind `LLM` (upstream: vllm/v1/engine/llm_engine.py).

add_request: InputProcessor (validate, tokenize) -> OutputProcessor.add_request
             -> engine core
step:        engine core outputs -> OutputProcessor.process_outputs
             -> abort what stop strings finished -> RequestOutputs
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from copy import copy
from typing import TYPE_CHECKING, Any

import vllm.envs as envs
from vllm.config import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import PromptType
from vllm.logger import init_logger
from vllm.outputs import PoolingRequestOutput, RequestOutput
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm.transformers_utils.tokenizer import cached_tokenizer_from_config
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.core_client_base import EngineCoreClient
from vllm.v1.engine.core_sleep import validate_sleep_args, validate_wake_up_tags
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.engine.parallel_sampling import ParentRequest

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike
    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)


class LLMEngine:
    """Synchronous engine: requests in, `RequestOutput`s out, one `step()` at a time."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        executor_class: type[Executor],
        log_stats: bool,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[Any] | None = None,
        multiprocess_mode: bool = False,
    ) -> None:
        if stat_loggers:
            raise NotImplementedError("Custom stat loggers are not supported yet.")
        if vllm_config.observability_config.tracing_enabled:
            # The request timings are tracked by AsyncLLM's front end only.
            raise ValueError(
                "otlp_traces_endpoint (--otlp-traces-endpoint) traces the requests of "
                "`vllm serve` (AsyncLLM); LLM / LLMEngine do not export spans here."
            )
        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        assert model_config is not None, "an engine needs a model"
        self.model_config = model_config
        self.cache_config = vllm_config.cache_config
        self.log_stats = log_stats
        self.usage_context = usage_context
        tokenizer = (
            None
            if self.model_config.skip_tokenizer_init
            else cached_tokenizer_from_config(self.model_config)
        )
        self.tokenizer = tokenizer
        self.input_processor = InputProcessor(vllm_config, tokenizer)
        # Adapter ids loaded through this engine (see _ensure_lora_loaded).
        self._lora_ids_loaded: set[int] = set()
        self.output_processor = OutputProcessor(
            tokenizer,
            log_stats=log_stats,
            stream_interval=vllm_config.scheduler_config.stream_interval,
        )
        self.engine_core = EngineCoreClient.make_client(
            multiprocess_mode=multiprocess_mode,
            asyncio_mode=False,
            vllm_config=vllm_config,
            executor_class=executor_class,
            log_stats=log_stats,
        )
        self._sleeping = False
        # The in-process core's executor, for callers that reach into it (None
        # when the core runs in its own process).
        inproc_core = getattr(self.engine_core, "engine_core", None)
        self.model_executor = getattr(inproc_core, "model_executor", None)

    @classmethod
    def from_vllm_config(
        cls,
        vllm_config: VllmConfig,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[Any] | None = None,
        disable_log_stats: bool = False,
    ) -> LLMEngine:
        from vllm.v1.executor.abstract import Executor

        return cls(
            vllm_config=vllm_config,
            executor_class=Executor.get_class(vllm_config),
            log_stats=not disable_log_stats,
            usage_context=usage_context,
            stat_loggers=stat_loggers,
            multiprocess_mode=envs.VLLM_ENABLE_V1_MULTIPROCESSING,
        )

    @classmethod
    def from_engine_args(
        cls,
        engine_args: EngineArgs,
        usage_context: UsageContext = UsageContext.ENGINE_CONTEXT,
        stat_loggers: list[Any] | None = None,
        enable_multiprocessing: bool = False,
    ) -> LLMEngine:
        """Build the config from `engine_args`, then the engine."""
        from vllm.v1.executor.abstract import Executor

        vllm_config = engine_args.create_engine_config(usage_context)
        if envs.VLLM_ENABLE_V1_MULTIPROCESSING:
            enable_multiprocessing = True
        return cls(
            vllm_config=vllm_config,
            executor_class=Executor.get_class(vllm_config),
            log_stats=not engine_args.disable_log_stats,
            usage_context=usage_context,
            stat_loggers=stat_loggers,
            multiprocess_mode=enable_multiprocessing,
        )

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Validate and submit one request; returns its internal request id.

        Raises ValueError (VLLMValidationError) for bad prompts or params; the
        engine is left untouched in that case.
        """
        if not isinstance(request_id, str):
            raise TypeError(f"request_id must be a string, got {type(request_id)}")
        if self._sleeping:
            # Nothing would be scheduled: step() would wait forever.
            raise RuntimeError("The engine is sleeping: call wake_up() before adding requests.")
        request = self.input_processor.process_inputs(
            request_id,
            prompt,
            params,
            arrival_time=arrival_time,
            lora_request=lora_request,
            tokenization_kwargs=tokenization_kwargs,
            trace_headers=trace_headers,
            priority=priority,
            reasoning_ended=reasoning_ended,
            reasoning_parser_kwargs=reasoning_parser_kwargs,
        )
        if request.lora_request is not None:
            self._ensure_lora_loaded(request.lora_request)
        self.input_processor.assign_request_id(request)
        prompt_text = prompt if isinstance(prompt, str) else prompt.get("prompt")
        # The processed copy of the params (max_tokens and stop ids filled in).
        processed_params = request.sampling_params
        if processed_params is None or processed_params.n == 1:  # pooling, or n == 1
            self.output_processor.add_request(request, prompt_text, None, 0)
            self.engine_core.add_request(request)
            return request.request_id
        # n > 1: n child requests with n=1 each; the output processor gathers
        # their outputs back under the parent's id.
        parent_req = ParentRequest(request)
        for idx in range(processed_params.n):
            child_id, child_params = parent_req.get_child_info(idx)
            child = request if idx == processed_params.n - 1 else copy(request)
            child.request_id = child_id
            child.sampling_params = child_params
            self.output_processor.add_request(child, prompt_text, parent_req, idx)
            self.engine_core.add_request(child)
        return parent_req.request_id

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        """Abort requests by user id (or, internal=True, by internal id)."""
        to_abort = self.output_processor.abort_requests(request_ids, internal)
        self.engine_core.abort_requests(to_abort)

    def step(self) -> list[RequestOutput | PoolingRequestOutput[Any]]:
        """Run one engine step and return the outputs it produced."""
        if self._sleeping:
            # Nothing is scheduled: waiting for outputs would never end.
            raise RuntimeError("The engine is sleeping: call wake_up() before step().")
        outputs = self.engine_core.get_output()
        processed = self.output_processor.process_outputs(
            outputs.outputs, engine_core_timestamp=outputs.timestamp
        )
        # Requests that stop strings finished here are still live in the core.
        self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def get_tokenizer(self) -> TokenizerLike:
        return self.input_processor.get_tokenizer()

    # ---- LoRA adapters ----
    def _ensure_lora_loaded(self, lora_request: LoRARequest) -> None:
        """Load an adapter on its first request, so that a bad one raises
        here (LoRAAdapterNotFoundError, ValueError) with nothing queued."""
        if lora_request.lora_int_id not in self._lora_ids_loaded:
            self.add_lora(lora_request)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load a new LoRA adapter into the engine for future requests."""
        loaded = self.engine_core.add_lora(lora_request)
        self._lora_ids_loaded.add(lora_request.lora_int_id)
        return loaded

    def remove_lora(self, lora_id: int) -> bool:
        """Remove an already loaded LoRA adapter."""
        self._lora_ids_loaded.discard(lora_id)
        return self.engine_core.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        """List all registered adapters."""
        return self.engine_core.list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        """Prevent an adapter from being evicted."""
        return self.engine_core.pin_lora(lora_id)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.engine_core.reset_prefix_cache(reset_running_requests)

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        return self.engine_core.collective_rpc(method, timeout, args, kwargs)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Put the engine to sleep (level 1: the KV cache's memory is given
        back; level 2: the weights' too). The requests in flight are aborted
        (mode "abort") or kept for wake_up ("keep"); "wait" needs none in
        flight here, since only step() would finish them."""
        validate_sleep_args(self.vllm_config, level, mode)
        if mode == "wait" and self.has_unfinished_requests():
            # Only step() runs them, and sleep() cannot return their outputs.
            raise ValueError(
                "Sleep mode 'wait' with requests in flight: step() them to "
                "completion first, or use mode 'abort'."
            )
        if mode == "abort":
            self.abort_request(list(self.output_processor.request_states), internal=True)
        self.engine_core.sleep(level, mode)
        self._sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: all)."""
        validate_wake_up_tags(self.vllm_config, tags)
        self.engine_core.wake_up(tags)
        self._sleeping = self.engine_core.is_sleeping()

    def is_sleeping(self) -> bool:
        return self.engine_core.is_sleeping()

    def shutdown(self) -> None:
        self.engine_core.shutdown()
