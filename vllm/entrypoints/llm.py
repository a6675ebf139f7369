"""The offline inference API (upstream: vllm/entrypoints/llm.py).

    llm = LLM()                                   # the embedded default model
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=8))

`generate` submits every prompt, then steps the engine until all are done
and returns the outputs in submission order. `chat` renders conversations
with the chat template first; `beam_search` drives `generate` one token at
a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from tqdm.auto import tqdm

from vllm.beam_search import (
    BeamSearchInstance,
    BeamSearchOutput,
    BeamSearchSequence,
    create_sort_beams_key_function,
)
from vllm.config.pooler import PoolerConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.chat_utils import (
    ChatCompletionMessageParam,
    ChatTemplateContentFormatOption,
    apply_hf_chat_template,
)
from vllm.entrypoints.llm_pooling import PoolingMixin
from vllm.inputs import PromptType, TextPrompt, TokensPrompt
from vllm.logger import init_logger
from vllm.outputs import PoolingRequestOutput, RequestOutput
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.llm_engine import LLMEngine

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike

logger = init_logger(__name__)


class LLM(PoolingMixin):
    """An LLM for offline inference: a tokenizer, a model and a paged KV cache.

    `model` is a local Hugging Face model folder or a `.gguf` file; empty means
    the embedded SmolLM2-135M-Instruct. Any other `EngineArgs` field can be
    passed as a keyword (e.g. `max_model_len=512`, `enable_prefix_caching=False`).
    """

    def __init__(
        self,
        model: str = "",
        *,
        runner: str = "auto",
        tokenizer: str | None = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        quantization: str | None = None,
        revision: str | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        enforce_eager: bool = False,
        hf_overrides: dict[str, Any] | None = None,
        pooler_config: PoolerConfig | dict[str, Any] | None = None,
        kv_cache_memory_bytes: int | None = None,
        compilation_config: int | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        # The offline API logs no periodic stats unless asked to.
        kwargs.setdefault("disable_log_stats", True)
        _dp_size = int(kwargs.get("data_parallel_size", 1))
        if _dp_size > 1 and kwargs.get("distributed_executor_backend") != "external_launcher":
            # As upstream: data parallelism is a server feature (vllm serve -dp N).
            raise ValueError(
                f"LLM(data_parallel_size={_dp_size}) is not supported for single-"
                "process usage and may hang. Please use "
                "the explicit multi-process data-parallel example at "
                "'examples/features/data_parallel/data_parallel_offline.py'."
            )
        engine_args = EngineArgs(
            model=model,
            runner=runner,
            tokenizer=tokenizer,
            tokenizer_mode=tokenizer_mode,
            skip_tokenizer_init=skip_tokenizer_init,
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            quantization=quantization,
            revision=revision,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            hf_overrides=hf_overrides,
            pooler_config=pooler_config,  # type: ignore[arg-type]  # also a PoolerConfig
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            compilation_config=compilation_config,
            **kwargs,
        )
        self.llm_engine = LLMEngine.from_engine_args(
            engine_args, usage_context=UsageContext.LLM_CLASS
        )
        self.engine_class = type(self.llm_engine)
        self.model_config = self.llm_engine.model_config
        self.request_counter = itertools.count()
        self.default_sampling_params: dict[str, Any] | None = None

    def get_tokenizer(self) -> TokenizerLike:
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults."""
        if self.default_sampling_params is None:
            self.default_sampling_params = self.model_config.get_diff_sampling_param()
        if self.default_sampling_params:
            return SamplingParams.from_optional(**self.default_sampling_params)
        return SamplingParams()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool | Callable[..., tqdm] = True,
        lora_request: Sequence[LoRARequest | None] | LoRARequest | None = None,
        priority: list[int] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for the prompts, in the order given.

        prompts: a str, a TextPrompt / TokensPrompt dict, or a list of them.
        sampling_params: one for all prompts or one per prompt (default: the
        model's generation-config defaults). lora_request: one for all prompts
        or one per prompt. priority: one int per prompt (with the "priority"
        scheduling policy; lower runs first).
        """
        if self.model_config.runner_type != "generate":
            raise ValueError(
                f"LLM.generate() is only supported for generative models; model "
                f"{self.model_config.served_model_name!r} runs with runner='pooling'."
            )
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        self._validate_and_add_requests(
            prompts,
            sampling_params,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            priority=priority,
            tokenization_kwargs=tokenization_kwargs,
        )
        return self._run_engine(use_tqdm=use_tqdm)

    def chat(
        self,
        messages: list[ChatCompletionMessageParam] | Sequence[list[ChatCompletionMessageParam]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        lora_request: Sequence[LoRARequest | None] | LoRARequest | None = None,
        chat_template: str | None = None,
        chat_template_content_format: ChatTemplateContentFormatOption = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of {"role", "content"}
        messages) or to several, rendered with the chat template (`chat_template`,
        else the tokenizer's). `add_generation_prompt` appends the assistant
        header; `continue_final_message` instead leaves the last (assistant)
        message open for the model to continue; both at once is an error.
        `chat_template_kwargs` reach the template (e.g. `enable_thinking`).
        `lora_request`: one adapter for every conversation, or one per conversation.
        """
        if self.model_config.runner_type != "generate":
            raise ValueError("LLM.chat() is only supported for generative models.")
        if mm_processor_kwargs:
            raise ValueError("Multimodal inputs are not supported.")
        conversations = _conversations(messages)
        tokenizer = self.get_tokenizer()
        prompts: list[PromptType] = []
        for conversation in conversations:
            text = apply_hf_chat_template(
                tokenizer,
                conversation,
                chat_template,
                tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template_content_format=chat_template_content_format,
                chat_template_kwargs=chat_template_kwargs,
            )
            # The template writes the special tokens (BOS...) itself.
            ids = tokenizer.encode(text, add_special_tokens=False, **(tokenization_kwargs or {}))
            prompts.append(TokensPrompt(prompt_token_ids=ids, prompt=text))
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def beam_search(
        self,
        prompts: Sequence[TokensPrompt | TextPrompt | str],
        params: BeamSearchParams,
        lora_request: Sequence[LoRARequest | None] | LoRARequest | None = None,
        use_tqdm: bool = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """Beam search over each prompt, as upstream: every step, each live
        beam is generated for one token with the top `2 * beam_width`
        logprobs; candidates ending in EOS (unless `ignore_eos`) are finished,
        the best `beam_width` others live on. After `max_tokens` steps the
        finished and live beams are ranked by cumulative logprob / length **
        length_penalty (length = prompt + generated, final EOS excluded).
        `concurrency_limit` bounds how many prompts are searched at a time.
        `lora_request`: one adapter for every prompt, or one per prompt.
        """
        tokenizer = self.get_tokenizer()
        if isinstance(lora_request, Sequence):
            if len(lora_request) != len(prompts):
                raise ValueError("Lists of LoRA requests must be the same length as the prompts.")
            loras = list(lora_request)
        else:
            loras = [lora_request] * len(prompts)
        instances = [
            BeamSearchInstance.from_prompt(self._beam_prompt_tokens(p, tokenizer), lora)
            for p, lora in zip(prompts, loras)
        ]
        step_params = SamplingParams(
            logprobs=2 * params.beam_width, max_tokens=1, temperature=params.temperature
        )
        sort_key = create_sort_beams_key_function(tokenizer.eos_token_id, params.length_penalty)
        limit = concurrency_limit or max(len(instances), 1)
        for start in range(0, len(instances), limit):
            batch = instances[start : start + limit]
            steps = range(params.max_tokens)
            for _ in tqdm(steps, desc="Beam search") if use_tqdm else steps:
                if not self._beam_search_step(
                    batch, params, step_params, sort_key, tokenizer.eos_token_id
                ):
                    break
        outputs = []
        for instance in instances:
            best = sorted(instance.completed + instance.beams, key=sort_key, reverse=True)[
                : params.beam_width
            ]
            for beam in best:
                beam.text = tokenizer.decode(beam.tokens)
            outputs.append(BeamSearchOutput(sequences=best))
        return outputs

    @staticmethod
    def _beam_prompt_tokens(
        prompt: TokensPrompt | TextPrompt | str, tokenizer: TokenizerLike
    ) -> list[int]:
        if isinstance(prompt, str):
            return tokenizer.encode(prompt)
        token_ids = prompt.get("prompt_token_ids")
        if isinstance(token_ids, list):
            return list(token_ids)
        return tokenizer.encode(prompt["prompt"])

    def _beam_search_step(
        self,
        instances: list[BeamSearchInstance],
        params: BeamSearchParams,
        step_params: SamplingParams,
        sort_key: Callable[..., float],
        eos_token_id: int | None,
    ) -> bool:
        """Extend every live beam by one token; False when no beam was left."""
        all_beams = [beam for instance in instances for beam in instance.beams]
        if not all_beams:
            return False
        results = self.generate(
            [TokensPrompt(prompt_token_ids=beam.tokens) for beam in all_beams],
            step_params,
            use_tqdm=False,
            lora_request=[beam.lora_request for beam in all_beams],
        )
        position = 0
        for instance in instances:
            candidates: list[BeamSearchSequence] = []
            for beam in instance.beams:
                result = results[position].outputs[0]
                position += 1
                if not result.logprobs:  # finished without a token (aborted)
                    continue
                step_logprobs = result.logprobs[0]
                for token_id, logprob in step_logprobs.items():
                    new_beam = BeamSearchSequence(
                        tokens=beam.tokens + [token_id],
                        logprobs=beam.logprobs + [step_logprobs],
                        lora_request=beam.lora_request,
                        cum_logprob=beam.cum_logprob + logprob.logprob,
                    )
                    if token_id == eos_token_id and not params.ignore_eos:
                        instance.completed.append(new_beam)
                    else:
                        candidates.append(new_beam)
            candidates.sort(key=sort_key, reverse=True)
            instance.beams = candidates[: params.beam_width]
        return True

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        return self.llm_engine.reset_prefix_cache(reset_running_requests)

    def collective_rpc(
        self,
        method: str | Callable,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Call `method` on every worker."""
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        """Give back memory until `wake_up` (needs enable_sleep_mode=True):
        level 1 the KV cache's, level 2 the weights' too (reloaded from the
        checkpoint on wake-up). The prefix cache is reset."""
        self.llm_engine.sleep(level, mode)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: all)."""
        self.llm_engine.wake_up(tags)

    # ------------------------------------------------------------------
    # Internals
    # ------------------------------------------------------------------

    def _validate_and_add_requests(
        self,
        prompts: PromptType | Sequence[PromptType],
        params: SamplingParams | PoolingParams | Sequence[SamplingParams | PoolingParams],
        *,
        use_tqdm: bool | Callable[..., tqdm],
        lora_request: Sequence[LoRARequest | None] | LoRARequest | None,
        priority: list[int] | None,
        tokenization_kwargs: dict[str, Any] | None,
    ) -> None:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        num_requests = len(prompts)
        if isinstance(params, Sequence) and len(params) != num_requests:
            raise ValueError("The lengths of prompts and params must be the same.")
        if isinstance(lora_request, Sequence) and len(lora_request) != num_requests:
            raise ValueError("Lists of LoRA requests must be the same length as the prompts.")
        if priority is not None and len(priority) != num_requests:
            raise ValueError("The lengths of prompts and priority must be the same.")
        param_list = list(params) if isinstance(params, Sequence) else [params] * num_requests
        for sp in param_list:
            if isinstance(sp, SamplingParams):
                # Offline: only the final output of each request is wanted.
                sp.output_kind = RequestOutputKind.FINAL_ONLY
        added: list[str] = []
        it = prompts
        if use_tqdm and num_requests > 1:
            tqdm_func = use_tqdm if callable(use_tqdm) else tqdm
            it = tqdm_func(prompts, desc="Adding requests")
        try:
            for i, prompt in enumerate(it):
                lora = lora_request[i] if isinstance(lora_request, Sequence) else lora_request
                added.append(
                    self._add_request(
                        prompt,
                        param_list[i],
                        lora_request=lora,
                        priority=priority[i] if priority else 0,
                        tokenization_kwargs=tokenization_kwargs,
                    )
                )
        except Exception:
            # One bad prompt fails the call; the ones already added must not linger.
            if added:
                self.llm_engine.abort_request(added, internal=True)
            raise

    def _add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | PoolingParams,
        lora_request: LoRARequest | None,
        priority: int,
        tokenization_kwargs: dict[str, Any] | None,
    ) -> str:
        request_id = str(next(self.request_counter))
        return self.llm_engine.add_request(
            request_id,
            prompt,
            params,
            lora_request=lora_request,
            tokenization_kwargs=tokenization_kwargs,
            priority=priority,
        )

    def _run_engine(self, *, use_tqdm: bool | Callable[..., tqdm]) -> list[RequestOutput]:
        """Step until every request is done; outputs sorted by request id."""
        pbar = None
        if use_tqdm:
            tqdm_func = use_tqdm if callable(use_tqdm) else tqdm
            pbar = tqdm_func(
                total=self.llm_engine.get_num_unfinished_requests(),
                desc="Processed prompts",
                dynamic_ncols=True,
                postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s",
            )
        outputs: list[Any] = []
        total_in = total_out = 0
        while self.llm_engine.has_unfinished_requests():
            for output in self.llm_engine.step():
                if not output.finished:
                    continue
                outputs.append(output)
                if pbar is not None:
                    if isinstance(output, PoolingRequestOutput):  # one row, no tokens out
                        total_in += len(output.prompt_token_ids)
                        _update_speed(pbar, total_in, total_out, 1)
                        continue
                    n = len(output.outputs)
                    total_in += len(output.prompt_token_ids or []) * n
                    total_out += sum(len(o.token_ids) for o in output.outputs)
                    _update_speed(pbar, total_in, total_out, n)
        if pbar is not None:
            pbar.close()
        # Requests finish out of order; the caller's order is the id order.
        return sorted(outputs, key=lambda o: int(o.request_id))


def _update_speed(pbar: tqdm, total_in: int, total_out: int, n: int) -> None:
    elapsed = pbar.format_dict["elapsed"] or 1e-9
    pbar.postfix = (
        f"est. speed input: {total_in / elapsed:.2f} toks/s, "
        f"output: {total_out / elapsed:.2f} toks/s"
    )
    pbar.update(n)
    if pbar.n == pbar.total:
        pbar.refresh()


def _conversations(
    messages: list[ChatCompletionMessageParam] | Sequence[list[ChatCompletionMessageParam]],
) -> list[list[ChatCompletionMessageParam]]:
    """`LLM.chat`'s input as a list of conversations: one conversation (a
    list of message dicts) or a sequence of them."""
    if not messages or isinstance(messages[0], dict):
        return [cast(list[ChatCompletionMessageParam], messages)]
    return list(cast(Sequence[list[ChatCompletionMessageParam]], messages))
