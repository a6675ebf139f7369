"""From a user's prompt and params to an `EngineCoreRequest`
(upstream: vllm/v1/engine/input_processor.py).

Everything a user can get wrong is checked here, before the request reaches
the engine core, and raised as a `ValueError` (`VLLMValidationError`, HTTP 400
in the server): an empty prompt, a token id outside the vocabulary, a prompt
that leaves no room in `max_model_len`, logprob counts over `max_logprobs`, a
structured-output constraint xgrammar cannot compile.

Structured outputs (`_validate_structured_output`): backend "auto" resolves
to xgrammar, unbuilt backends and `skip_tokenizer_init` are refused, and the
constraint is compiled once here so a bad one never reaches the core. A
request priority other than 0 is refused unless the scheduling policy is
"priority".
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from vllm.config import VllmConfig
from vllm.config.structured_outputs import verify_backend_name
from vllm.exceptions import VLLMValidationError
from vllm.inputs import PromptType
from vllm.logger import init_logger
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm.utils import random_uuid
from vllm.v1.engine import EngineCoreRequest

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)


class InputProcessor:
    """Validates and tokenizes prompts for one model."""

    def __init__(self, vllm_config: VllmConfig, tokenizer: TokenizerLike | None) -> None:
        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        assert model_config is not None, "an engine needs a model"
        self.model_config = model_config
        self.tokenizer = tokenizer
        # generation_config.json: its extra EOS ids become stop ids.
        self.generation_config_fields = self.model_config.try_get_generation_config()

    def get_tokenizer(self) -> TokenizerLike:
        if self.tokenizer is None:
            raise ValueError("Unable to get tokenizer because skip_tokenizer_init is True")
        return self.tokenizer

    @staticmethod
    def assign_request_id(request: EngineCoreRequest) -> None:
        """Keep the caller's id as `external_req_id` and give the request a unique
        internal id (`"{id}-{8 random chars}"`), so reused user ids cannot clash."""
        if request.external_req_id is not None:
            raise ValueError(
                "The external_req_id field should not be set on "
                "EngineCoreRequests passed to vLLM; use the request_id field."
            )
        request.external_req_id = request.request_id
        request.request_id = f"{request.external_req_id}-{random_uuid()[:8]}"

    def process_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Mapping[str, str] | None = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
        reasoning_ended: bool | None = None,
        reasoning_parser_kwargs: dict[str, Any] | None = None,
    ) -> EngineCoreRequest:
        """Validate `params` and `prompt`, tokenize, and build the engine request.

        `reasoning_ended` / `reasoning_parser_kwargs` travel to the engine
        core's structured-output manager (where a grammar starts when the
        engine has a reasoning parser; see vllm/v1/structured_output)."""
        if isinstance(params, PoolingParams):
            return self._process_pooling_inputs(
                request_id,
                prompt,
                params,
                arrival_time,
                lora_request,
                tokenization_kwargs,
                trace_headers,
                priority,
                data_parallel_rank,
            )
        self._validate_params(params)
        self._validate_lora(lora_request)
        if priority != 0 and self.vllm_config.scheduler_config.policy != "priority":
            # Upstream's check: under FCFS a priority would be silently ignored.
            raise VLLMValidationError(
                f"Got priority {priority} but Priority scheduling is not enabled.",
                parameter="priority",
            )
        if data_parallel_rank is not None and not (
            0 <= data_parallel_rank < self.vllm_config.parallel_config.data_parallel_size
        ):
            raise VLLMValidationError(f"data_parallel_rank {data_parallel_rank} is out of range.")
        prompt_token_ids, cache_salt = self._tokenize(prompt, tokenization_kwargs)
        self._validate_prompt(prompt_token_ids)
        sampling_params = params.clone()
        prompt_len = len(prompt_token_ids)
        if sampling_params.max_tokens is None:
            # Unset: generate up to the end of the context.
            sampling_params.max_tokens = self.model_config.max_model_len - prompt_len
            if sampling_params.min_tokens > sampling_params.max_tokens:
                raise VLLMValidationError(
                    "min_tokens must be less than or equal to max_tokens="
                    f"{sampling_params.max_tokens}, got {sampling_params.min_tokens}.",
                    parameter="min_tokens",
                )
        sampling_params.update_from_generation_config(
            self.generation_config_fields, self._eos_token_id()
        )
        if self.tokenizer is not None:
            sampling_params.update_from_tokenizer(self.tokenizer)
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            mm_features=None,
            sampling_params=sampling_params,
            pooling_params=None,
            eos_token_id=self._eos_token_id(),
            arrival_time=time.time() if arrival_time is None else arrival_time,
            lora_request=lora_request,
            cache_salt=cache_salt,
            data_parallel_rank=data_parallel_rank,
            priority=priority,
            trace_headers=dict(trace_headers) if trace_headers is not None else None,
            reasoning_ended=reasoning_ended,
            reasoning_parser_kwargs=reasoning_parser_kwargs,
        )

    def _process_pooling_inputs(
        self,
        request_id: str,
        prompt: PromptType,
        params: PoolingParams,
        arrival_time: float | None,
        lora_request: LoRARequest | None,
        tokenization_kwargs: dict[str, Any] | None,
        trace_headers: Mapping[str, str] | None,
        priority: int,
        data_parallel_rank: int | None,
    ) -> EngineCoreRequest:
        """A pooling request: the prompt tokenized (lower-cased first when the
        sentence-transformers config says do_lower_case), truncated to its
        last `truncate_prompt_tokens` tokens (-1: max_model_len) and checked;
        `params` must have been verified for its task (`PoolingParams.verify`)."""
        if self.model_config.runner_type != "pooling":
            raise VLLMValidationError(
                f"Model {self.model_config.served_model_name!r} is not a pooling model "
                "(runner_type='generate'); pooling requests need `--runner pooling`."
            )
        if params.task is None:
            raise VLLMValidationError("PoolingParams.verify(task, model_config) has not run.")
        self._validate_lora(lora_request)
        if priority != 0 and self.vllm_config.scheduler_config.policy != "priority":
            raise VLLMValidationError(
                f"Got priority {priority} but Priority scheduling is not enabled.",
                parameter="priority",
            )
        encoder_config = self.model_config.encoder_config or {}
        if encoder_config.get("do_lower_case"):
            prompt = _lower_case(prompt)
        prompt_token_ids, cache_salt = self._tokenize(prompt, tokenization_kwargs)
        truncate = params.truncate_prompt_tokens
        if truncate is not None:
            keep = self.model_config.max_model_len if truncate == -1 else truncate
            if keep > self.model_config.max_model_len:
                raise VLLMValidationError(
                    f"truncate_prompt_tokens value ({keep}) is greater than max_model_len "
                    f"({self.model_config.max_model_len}). Please, select a smaller truncation "
                    "size.",
                    parameter="truncate_prompt_tokens",
                )
            if keep > 0:
                prompt_token_ids = prompt_token_ids[-keep:]
        self._validate_prompt(prompt_token_ids)
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            mm_features=None,
            sampling_params=None,
            pooling_params=params.clone(),
            eos_token_id=self._eos_token_id(),
            arrival_time=time.time() if arrival_time is None else arrival_time,
            lora_request=lora_request,
            cache_salt=cache_salt,
            data_parallel_rank=data_parallel_rank,
            priority=priority,
            trace_headers=dict(trace_headers) if trace_headers is not None else None,
        )

    # ------------------------------------------------------------------
    # Parameters
    # ------------------------------------------------------------------

    def _validate_lora(self, lora_request: LoRARequest | None) -> None:
        """An adapter is accepted only when the engine runs LoRA (upstream's
        check and message); loading it is the workers' job (a bad adapter
        fails that request, see vllm/lora/worker_manager.py)."""
        if lora_request is not None and self.vllm_config.lora_config is None:
            raise VLLMValidationError(f"Got lora_request {lora_request} but LoRA is not enabled!")

    def _validate_params(self, params: Any) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(
                f"params must be SamplingParams or PoolingParams, got {type(params).__name__}"
            )
        if self.model_config.runner_type != "generate":
            raise VLLMValidationError(
                f"Model {self.model_config.served_model_name!r} is a pooling model "
                "(runner_type='pooling'); it does not support generation."
            )
        self._validate_logprobs(params)
        self._validate_token_id_params(params)
        self._validate_structured_output(params)

    def _validate_logprobs(self, params: SamplingParams) -> None:
        max_logprobs = self.model_config.max_logprobs
        vocab_size = self.model_config.get_vocab_size()
        if max_logprobs == -1:
            max_logprobs = vocab_size
        for name, label in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            num = getattr(params, name)
            if num is None:
                continue
            num = vocab_size if num == -1 else num
            if num > max_logprobs:
                raise VLLMValidationError(
                    f"Requested {label} logprobs of {num}, which is greater than max "
                    f"allowed: {max_logprobs}",
                    parameter=name,
                    value=num,
                )

    def _validate_token_id_params(self, params: SamplingParams) -> None:
        vocab_size = self.model_config.get_vocab_size()
        allowed = params.allowed_token_ids
        if allowed is not None:
            if not allowed:
                raise VLLMValidationError(
                    "allowed_token_ids is not None and empty!", parameter="allowed_token_ids"
                )
            if any(not 0 <= t < vocab_size for t in allowed):
                raise VLLMValidationError(
                    "allowed_token_ids contains out-of-vocab token id!",
                    parameter="allowed_token_ids",
                )
        if params.logit_bias:
            bad = [t for t in params.logit_bias if not 0 <= t < vocab_size]
            if bad:
                raise VLLMValidationError(
                    f"token_id(s) {bad} in logit_bias contain out-of-vocab token ids. "
                    f"Vocabulary size: {vocab_size}",
                    parameter="logit_bias",
                )
        bad_stop_ids = [t for t in params.stop_token_ids or () if not 0 <= t < vocab_size]
        if bad_stop_ids:
            raise VLLMValidationError(
                f"token_id(s) {bad_stop_ids} in stop_token_ids contain out-of-vocab token "
                f"ids. Vocabulary size: {vocab_size}",
                parameter="stop_token_ids",
                value=bad_stop_ids,
            )
        if params.bad_words and self.tokenizer is None:
            raise VLLMValidationError(
                "bad_words needs a tokenizer (skip_tokenizer_init is set).", parameter="bad_words"
            )

    def _validate_structured_output(self, params: SamplingParams) -> None:
        """Resolve the backend and check that xgrammar can compile the
        constraint, so that a bad one is a 400 here and never an error in the
        engine core. Records the backend on `params.structured_outputs`."""
        so_params = params.structured_outputs
        if so_params is None:
            return
        if self.model_config.skip_tokenizer_init or self.tokenizer is None:
            raise VLLMValidationError(
                "Structured outputs requires a tokenizer so it can't be used with "
                "'skip_tokenizer_init'",
                parameter="structured_outputs",
            )
        backend = self.vllm_config.structured_outputs_config.backend
        if (
            so_params._backend
            and so_params._backend != backend
            and not (backend == "auto" and so_params._backend_was_auto)
        ):
            # Params reused after an "auto" request carry "xgrammar" and
            # `_backend_was_auto`; anything else is a per-request choice.
            raise VLLMValidationError(
                "Request-level structured output backend selection is not supported. The "
                f"request specified {so_params._backend!r}, but vLLM was initialised with "
                f"{backend!r}. This error can be resolved by removing '_backend' from the "
                "request.",
                parameter="structured_outputs",
            )
        try:
            # The config refuses these when built; a config set by hand may not be.
            verify_backend_name(backend)
        except ValueError as e:
            raise VLLMValidationError(str(e), parameter="structured_outputs") from e
        if isinstance(so_params.grammar, str) and not so_params.grammar.strip():
            raise VLLMValidationError(
                "structured_outputs.grammar cannot be an empty string",
                parameter="structured_outputs",
            )
        # Imported here: xgrammar costs ~0.2 s of start-up, and only
        # structured-output requests need it.
        from vllm.v1.structured_output import backend_xgrammar

        try:
            backend_xgrammar.validate_xgrammar_grammar(params)
        except ValueError as e:
            raise VLLMValidationError(str(e), parameter="structured_outputs") from e
        so_params._backend = "xgrammar"
        so_params._backend_was_auto = backend == "auto"

    # ------------------------------------------------------------------
    # Prompts
    # ------------------------------------------------------------------

    def _tokenize(
        self, prompt: PromptType, tokenization_kwargs: dict[str, Any] | None
    ) -> tuple[list[int], str | None]:
        """(prompt token ids, cache salt) of a str, TextPrompt or TokensPrompt."""
        if isinstance(prompt, str):
            return self._encode(prompt, tokenization_kwargs), None
        if not isinstance(prompt, dict):
            raise TypeError(
                "A prompt must be a str, a TextPrompt or a TokensPrompt, got "
                f"{type(prompt).__name__}"
            )
        if prompt.get("multi_modal_data") is not None:
            raise VLLMValidationError("Multimodal inputs are not supported yet.")
        if "prompt_embeds" in prompt:
            raise VLLMValidationError("Prompt embeddings are not supported yet.")
        cache_salt = prompt.get("cache_salt")
        if "prompt_token_ids" in prompt:
            raw = prompt.get("prompt_token_ids")  # `in` does not narrow the TypedDicts
            ids = list(raw) if isinstance(raw, Iterable) and not isinstance(raw, str) else None
            if ids is None or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise VLLMValidationError("prompt_token_ids must be a list of ints.")
            return ids, cache_salt
        if "prompt" in prompt:
            return self._encode(prompt["prompt"], tokenization_kwargs), cache_salt
        raise VLLMValidationError("A prompt dict needs 'prompt' or 'prompt_token_ids'.")

    def _encode(self, text: str, tokenization_kwargs: dict[str, Any] | None) -> list[int]:
        if self.tokenizer is None:
            raise VLLMValidationError(
                "Text prompts need a tokenizer; with skip_tokenizer_init pass TokensPrompt instead."
            )
        return list(self.tokenizer.encode(text, **(tokenization_kwargs or {})))

    def _validate_prompt(self, prompt_ids: list[int]) -> None:
        prompt_len = len(prompt_ids)
        if prompt_len == 0:
            raise VLLMValidationError("The decoder prompt cannot be empty")
        max_len = self.model_config.max_model_len
        if prompt_len > max_len:
            raise VLLMValidationError(
                f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
                f"length of {max_len}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens."
            )
        if prompt_len == max_len and self.model_config.runner_type == "generate":
            raise VLLMValidationError(
                f"The decoder prompt (length {prompt_len}) plus the number of requested "
                f"output tokens (at least 1) is longer than the maximum model length of "
                f"{max_len}. Make sure that `max_model_len` is no smaller than the number of "
                "text tokens (prompt + requested output tokens)."
            )
        # The model's embedding table may be larger than the tokenizer's
        # vocabulary (padding), never smaller: it bounds what the model can read.
        vocab_size = self.model_config.get_vocab_size()
        bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
        if bad:
            raise VLLMValidationError(
                f"Token id {bad[0]} is out of vocabulary (vocabulary size {vocab_size})"
            )

    def _eos_token_id(self) -> int | None:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return self.tokenizer.eos_token_id
        eos = self.model_config.get_eos_token_id()
        if isinstance(eos, list):
            return eos[0] if eos else None
        return eos


def _lower_case(prompt: PromptType) -> PromptType:
    """A text prompt lower-cased (sentence-transformers do_lower_case)."""
    if isinstance(prompt, str):
        return prompt.lower()
    if isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        lowered = dict(prompt)
        lowered["prompt"] = prompt["prompt"].lower()
        return cast("PromptType", lowered)
    return prompt
