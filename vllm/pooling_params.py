"""API parameters of pooling requests (upstream: vllm/pooling_params.py).

`verify(task, model_config)` is called by the input processor for every
request: it fixes the task, merges the model's PoolerConfig defaults into the
fields left None, sets the task's default (use_activation True), checks
`dimensions` against the model's Matryoshka support, and refuses a field that
does not belong to the task. As upstream v0.28, `use_activation` is the
embedding tasks' L2 normalisation and the classification tasks' softmax /
sigmoid; `normalize`, `softmax` and `activation` are no fields (a keyword
argument naming one is a TypeError), and the removed tasks `score` / `encode`
are refused with upstream's messages.
"""

from __future__ import annotations

from copy import deepcopy
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind
from vllm.tasks import POOLING_TASKS, PoolingTask, check_removed_pooling_task

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig


class PoolingParams(
    msgspec.Struct,
    omit_defaults=True,  # type: ignore[call-arg]
    array_like=True,  # type: ignore[call-arg]
):
    """API parameters for pooling models.

    truncate_prompt_tokens: -1 keeps the model's max_model_len last tokens, k
        keeps the last k (left truncation), None does not truncate.
    use_activation: apply the pooler's activation: L2 normalisation for
        embeddings, softmax / sigmoid for classifiers (None: the pooler
        config's default, else True).
    dimensions: keep the first `dimensions` values of each embedding (models
        with Matryoshka representations only).
    """

    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    # every task
    use_activation: bool | None = None
    # embeddings
    dimensions: int | None = None
    # STEP pooling (models whose pooler_config.tok_pooling_type is STEP;
    # refused by verify otherwise): the step tag's token id and the columns
    # returned; None takes the pooler_config's.
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None
    # internal
    task: PoolingTask | None = None
    requires_token_ids: bool = False
    skip_reading_prefix_cache: bool | None = None
    extra_kwargs: dict[str, Any] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY

    def __post_init__(self) -> None:
        check_removed_pooling_task(self.task)
        if self.output_kind != RequestOutputKind.FINAL_ONLY:
            raise VLLMValidationError(
                f"For pooling output_kind has to be FINAL_ONLY, got {self.output_kind!r}"
            )

    @property
    def all_parameters(self) -> list[str]:
        return ["dimensions", "use_activation"]

    @property
    def valid_parameters(self) -> dict[str, list[str]]:
        return {
            "embed": ["dimensions", "use_activation"],
            "classify": ["use_activation"],
            "token_embed": ["dimensions", "use_activation"],
            "token_classify": ["use_activation"],
        }

    def clone(self) -> PoolingParams:
        return deepcopy(self)

    def verify(self, task: PoolingTask, model_config: ModelConfig | None = None) -> None:
        check_removed_pooling_task(task)
        if task not in POOLING_TASKS:
            raise ValueError(f"Unknown pooling task: {task!r}; choose one of {POOLING_TASKS}.")
        if self.task is None:
            self.task = task
        elif self.task != task:
            raise ValueError(f"You cannot overwrite {self.task=!r} with {task=!r}!")
        self._merge_default_parameters(model_config)
        self._verify_step_pooling(model_config)
        self._set_default_parameters(model_config)
        self._verify_valid_parameters()

    def _merge_default_parameters(self, model_config: ModelConfig | None) -> None:
        assert self.task is not None
        pooler_config = getattr(model_config, "pooler_config", None)
        if pooler_config is not None:
            for k in self.valid_parameters[self.task]:
                default = getattr(pooler_config, k, None)
                if default is not None and getattr(self, k) is None:
                    setattr(self, k, default)
        if self.skip_reading_prefix_cache is None:
            # Token-level outputs need every prompt token's hidden state, which
            # a prefix-cache hit would not compute.
            self.skip_reading_prefix_cache = self.task in ("token_embed", "token_classify")

    def _verify_step_pooling(self, model_config: ModelConfig | None) -> None:
        """step_tag_id / returned_token_ids: only for a model with STEP
        pooling, whose pooler_config gives the defaults (as upstream); the
        returned ids index the hidden state, so each must be below its size."""
        assert self.task is not None
        names = ("step_tag_id", "returned_token_ids")
        pooler_config = getattr(model_config, "pooler_config", None)
        if pooler_config is None or pooler_config.tok_pooling_type != "STEP":
            invalid = [k for k in names if getattr(self, k) is not None]
            if invalid:
                raise VLLMValidationError(
                    f"Task {self.task} only supports {self.valid_parameters[self.task]} "
                    f"parameters, does not support {invalid} parameters (they need a model "
                    "with pooling_type STEP)"
                )
            return
        for k in names:
            if getattr(self, k) is None:
                setattr(self, k, getattr(pooler_config, k))
        if self.step_tag_id is not None and type(self.step_tag_id) is not int:
            raise ValueError(f"step_tag_id must be a token id (int), got {self.step_tag_id!r}.")
        hidden = model_config.get_hidden_size()  # type: ignore[union-attr]
        ids = self.returned_token_ids or []
        bad = [i for i in ids if type(i) is not int or not 0 <= i < hidden]
        if bad:
            raise ValueError(
                f"returned_token_ids {bad} are out of range: they index the model's "
                f"hidden state (size {hidden})."
            )

    def _set_default_parameters(self, model_config: ModelConfig | None) -> None:
        if self.use_activation is None:
            self.use_activation = True
        embeds = self.task in ("embed", "token_embed")
        if embeds and self.dimensions is not None and model_config is not None:
            self._verify_dimensions(model_config, self.dimensions)

    @staticmethod
    def _verify_dimensions(model_config: ModelConfig, dimensions: int) -> None:
        """Matryoshka truncation: only on a model that says it supports it,
        within [1, embedding_size], and one of its listed sizes if it lists
        them (upstream v0.28's checks and messages)."""
        name = model_config.served_model_name
        if not model_config.is_matryoshka:
            raise VLLMValidationError(
                f"Model {name!r} does not support Matryoshka embeddings; dimensions "
                f"must be unset (received dimensions={dimensions}).",
                parameter="dimensions",
                value=dimensions,
            )
        size = model_config.embedding_size
        if not 1 <= dimensions <= size:
            raise VLLMValidationError(
                f"Model {name!r} only supports dimensions in range [1, {size}], got {dimensions}.",
                parameter="dimensions",
                value=dimensions,
            )
        mds = model_config.matryoshka_dimensions
        if mds is not None and dimensions not in mds:
            raise VLLMValidationError(
                f"Model {name!r} only supports Matryoshka dimensions {mds}, got {dimensions}.",
                parameter="dimensions",
                value=dimensions,
            )

    def _verify_valid_parameters(self) -> None:
        assert self.task is not None
        valid = self.valid_parameters[self.task]
        invalid = [
            k for k in self.all_parameters if k not in valid and getattr(self, k) is not None
        ]
        if invalid:
            raise VLLMValidationError(
                f"Task {self.task!r} only supports {valid} parameters, does not support "
                f"{invalid} parameters"
            )

    def __repr__(self) -> str:
        return (
            f"PoolingParams(task={self.task}, dimensions={self.dimensions}, "
            f"use_activation={self.use_activation}, step_tag_id={self.step_tag_id}, "
            f"returned_token_ids={self.returned_token_ids}, "
            f"truncate_prompt_tokens={self.truncate_prompt_tokens})"
        )
