"""`LLM`'s pooling methods (upstream: `encode`, `embed`, `classify`,
`reward` and `score` of vllm/entrypoints/llm.py; kept here, mixed into
`LLM`, so that each file stays readable).

Every method builds one PoolingParams per prompt, verifies it for its task
against the model (`PoolingParams.verify`: defaults from the pooler config,
`dimensions` only on Matryoshka models, no fields of another task), runs the
engine to completion and returns the outputs in prompt order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from tqdm.auto import tqdm

from vllm.entrypoints.score_utils import (
    ScoreData,
    _cosine_similarity,
    as_list,
    check_cross_encoder,
    check_token_limit,
    cross_encoder_request,
    score_input_lists,
    score_tokenization_kwargs,
    truncate_score_data,
)
from vllm.inputs import PromptType
from vllm.outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringRequestOutput,
)
from vllm.pooling_params import PoolingParams
from vllm.tasks import PoolingTask, check_removed_pooling_task

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig
    from vllm.lora.request import LoRARequest
    from vllm.tokenizers import TokenizerLike
    from vllm.v1.engine.llm_engine import LLMEngine

_TASK_HINTS = {
    "embed": "Embedding API is not supported by this model. Try converting the model "
    "using `--convert embed`.",
    "classify": "Classification API is not supported by this model. Try converting the "
    "model using `--convert classify`.",
    "token_classify": "Reward API is not supported by this model.",
}


class PoolingMixin:
    """Needs LLM's `llm_engine`, `model_config`, `get_tokenizer`,
    `_validate_and_add_requests` and `_run_engine`."""

    llm_engine: LLMEngine
    model_config: ModelConfig
    get_tokenizer: Callable[[], TokenizerLike]
    _validate_and_add_requests: Callable[..., None]
    _run_engine: Callable[..., list[Any]]

    @property
    def supported_tasks(self) -> tuple[str, ...]:
        tasks = getattr(self, "_supported_tasks", None)
        if tasks is None:
            tasks = tuple(self.llm_engine.collective_rpc("get_supported_tasks")[0])
            self._supported_tasks = tasks
        return tasks

    def encode(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        lora_request: list[LoRARequest] | LoRARequest | None = None,
        pooling_task: PoolingTask | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[PoolingRequestOutput]:
        """The pooler's raw outputs for `pooling_task` ("embed", "classify",
        "token_embed", "token_classify"), one per prompt."""
        self._check_pooling_model("LLM.encode()")
        if pooling_task is None:
            raise ValueError(
                "pooling_task required for `LLM.encode`\n"
                "Please use one of the more specific methods or set the pooling_task when "
                "using `LLM.encode`:\n"
                '  - For embeddings, use `LLM.embed(...)` or `pooling_task="embed"`.\n'
                "  - For classification logits, use `LLM.classify(...)` or "
                '`pooling_task="classify"`.\n'
                "  - For similarity scores, use `LLM.score(...)`.\n"
                '  - For rewards, use `LLM.reward(...)` or `pooling_task="token_classify"`\n'
                '  - For token classification, use `pooling_task="token_classify"`\n'
                '  - For multi-vector retrieval, use `pooling_task="token_embed"`'
            )
        check_removed_pooling_task(pooling_task)
        if pooling_task not in self.supported_tasks:
            hint = _TASK_HINTS.get(pooling_task, "")
            raise ValueError(
                f"pooling_task must be one of {self.supported_tasks} for model "
                f"{self.model_config.served_model_name!r}, got {pooling_task!r}. {hint}"
            )
        prompt_list = as_list(prompts)
        if not prompt_list:
            return []
        params_list = self._pooling_params_list(
            pooling_params, len(prompt_list), pooling_task, truncate_prompt_tokens
        )
        self._validate_and_add_requests(
            prompt_list,
            params_list,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            priority=None,
            tokenization_kwargs=tokenization_kwargs,
        )
        return cast(list[PoolingRequestOutput], self._run_engine(use_tqdm=use_tqdm))

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        lora_request: list[LoRARequest] | LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding vector per prompt."""
        self._check_pooling_model("LLM.embed()")
        items = self.encode(
            prompts,
            pooling_params,
            truncate_prompt_tokens=truncate_prompt_tokens,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="embed",
            tokenization_kwargs=tokenization_kwargs,
        )
        return [EmbeddingRequestOutput.from_base(item) for item in items]

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        *,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        lora_request: list[LoRARequest] | LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[ClassificationRequestOutput]:
        """Class probabilities (softmax / sigmoid of the logits) per prompt."""
        self._check_pooling_model("LLM.classify()")
        items = self.encode(
            prompts,
            pooling_params,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="classify",
            tokenization_kwargs=tokenization_kwargs,
        )
        return [ClassificationRequestOutput.from_base(item) for item in items]

    def reward(
        self,
        prompts: PromptType | Sequence[PromptType],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        lora_request: list[LoRARequest] | LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
    ) -> list[PoolingRequestOutput]:
        """Per-token reward scores ([num_tokens, num_labels] per prompt)."""
        self._check_pooling_model("LLM.reward()")
        return self.encode(
            prompts,
            pooling_params,
            truncate_prompt_tokens=truncate_prompt_tokens,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            pooling_task="token_classify",
            tokenization_kwargs=tokenization_kwargs,
        )

    def score(
        self,
        data_1: ScoreData | list[ScoreData],
        data_2: ScoreData | list[ScoreData],
        /,
        *,
        use_tqdm: bool | Callable[..., tqdm] = True,
        pooling_params: PoolingParams | None = None,
        lora_request: list[LoRARequest] | LoRARequest | None = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> list[ScoringRequestOutput]:
        """Similarity of each (data_1, data_2) pair, 1:1, 1:N or N:N: a
        cross-encoder's score of the pair, or the cosine of two embeddings.
        Truncation as upstream v0.28: `tokenization_kwargs` (e.g.
        truncation=True, max_length=k) go to the tokenizer, and
        `pooling_params.extra_kwargs` may hold max_tokens_per_query /
        max_tokens_per_doc (each text cut to that many content tokens)."""
        self._check_pooling_model("LLM.score()")
        if chat_template is not None:
            raise ValueError(
                "chat_template is not supported by LLM.score here: score templates "
                "(templated cross-encoder prompts) are not built; pass chat_template=None."
            )
        cross_encoder = self.model_config.is_cross_encoder
        if cross_encoder:
            check_cross_encoder(self.model_config)
        elif "embed" not in self.supported_tasks:
            raise ValueError("This model does not support the Scoring API.")
        list_1, list_2 = score_input_lists(data_1, data_2)
        params = pooling_params or PoolingParams()
        extra = params.extra_kwargs or {}
        max_len = self.model_config.max_model_len
        max_query, max_doc = (
            check_token_limit(int(extra.get(name, 0)), name, max_len) if extra.get(name) else 0
            for name in ("max_tokens_per_query", "max_tokens_per_doc")
        )
        tokenizer = None if self.model_config.skip_tokenizer_init else self.get_tokenizer()
        if tokenizer is not None:
            list_1 = truncate_score_data(list_1, tokenizer, max_query)
            list_2 = truncate_score_data(list_2, tokenizer, max_doc)
        common = dict(
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            tokenization_kwargs=tokenization_kwargs,
        )
        if cross_encoder:
            return self._cross_encoding_score(list_1, list_2, params, max_doc, **common)
        return self._embedding_score(list_1, list_2, params, tokenizer, **common)

    # ---- internals ------------------------------------------------------------
    def _check_pooling_model(self, api: str) -> None:
        if self.model_config.runner_type != "pooling":
            raise ValueError(
                f"{api} is only supported for pooling models; model "
                f"{self.model_config.served_model_name!r} runs as a generative model "
                "(runner='generate'). Try passing `--runner pooling` (LLM(runner='pooling')) "
                "to use the model as a pooling model."
            )

    def _pooling_params_list(
        self,
        pooling_params: PoolingParams | Sequence[PoolingParams] | None,
        n: int,
        task: PoolingTask,
        truncate_prompt_tokens: int | None,
    ) -> list[PoolingParams]:
        if pooling_params is None:
            pooling_params = PoolingParams()
        if isinstance(pooling_params, PoolingParams):
            params_list = [pooling_params.clone() for _ in range(n)]
        else:
            if len(pooling_params) != n:
                raise ValueError("The lengths of prompts and pooling_params must be the same.")
            params_list = [p.clone() for p in pooling_params]
        for params in params_list:
            if truncate_prompt_tokens is not None:
                params.truncate_prompt_tokens = truncate_prompt_tokens
            params.verify(task, self.model_config)
        return params_list

    def _embedding_score(
        self,
        list_1: list[ScoreData],
        list_2: list[ScoreData],
        params: PoolingParams,
        tokenizer: TokenizerLike | None,
        **kwargs: Any,
    ) -> list[ScoringRequestOutput]:
        embeddings = self.encode(list_1 + list_2, params, pooling_task="embed", **kwargs)
        embed_1, embed_2 = embeddings[: len(list_1)], embeddings[len(list_1) :]
        if len(embed_1) == 1:
            embed_1 = embed_1 * len(embed_2)
        return _cosine_similarity(tokenizer, embed_1, embed_2)

    def _cross_encoding_score(
        self,
        list_1: list[ScoreData],
        list_2: list[ScoreData],
        params: PoolingParams,
        max_tokens_per_doc: int,
        **kwargs: Any,
    ) -> list[ScoringRequestOutput]:
        if len(list_1) == 1:
            list_1 = list_1 * len(list_2)
        tokenizer = self.get_tokenizer()
        tok_kwargs = score_tokenization_kwargs(
            None, self.model_config.max_model_len, kwargs.pop("tokenization_kwargs")
        )
        requests = [
            cross_encoder_request(
                tokenizer, q, d, params, tok_kwargs, max_tokens_per_doc=max_tokens_per_doc
            )
            for q, d in zip(list_1, list_2)
        ]
        items = self.encode(
            [prompt for prompt, _ in requests],
            [params for _, params in requests],
            pooling_task="classify",
            **kwargs,
        )
        return [ScoringRequestOutput.from_base(item) for item in items]
