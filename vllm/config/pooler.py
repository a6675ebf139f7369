"""Pooler configuration (upstream: vllm/config/pooler.py, v0.28).

Set with `--pooler-config '{"pooling_type": "MEAN", ...}'` (or
`LLM(pooler_config=...)`); fields left None take the sentence-transformers
files' values, then the model's defaults (resolved by ModelConfig).

`pooling_type` is a convenience: a sequence type (CLS / LAST / MEAN) fills
`seq_pooling_type` (embed / classify), a token type (ALL / STEP) fills
`tok_pooling_type` (token_embed / token_classify); the poolers read those two.
Fields upstream v0.28 removed are refused: `normalize` with its message,
`softmax` / `activation` / `logit_bias` as unknown fields.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from vllm.tasks import POOLING_TASKS, PoolingTask, check_removed_pooling_task

SequencePoolingType = Literal["CLS", "LAST", "MEAN"]
SEQ_POOLING_TYPES: tuple[SequencePoolingType, ...] = get_args(SequencePoolingType)

TokenPoolingType = Literal["ALL", "STEP"]
TOK_POOLING_TYPES: tuple[TokenPoolingType, ...] = get_args(TokenPoolingType)

POOLING_TYPES: tuple[str, ...] = SEQ_POOLING_TYPES + TOK_POOLING_TYPES


@dataclass
class PoolerConfig:
    """Controls the behavior of output pooling in pooling models."""

    # The task of the model's pooling requests (LLM.encode / `/pooling`
    # without a task); None: the first supported one of embed, classify,
    # token_embed, token_classify. Other supported tasks are refused there.
    task: PoolingTask | None = None
    # Fills seq_pooling_type or tok_pooling_type (not both may be set).
    pooling_type: str | None = None
    # Sequence tasks' pooling (None: the sentence-transformers config's, else
    # the model class's default).
    seq_pooling_type: str | None = None
    # Token tasks' pooling (None: the model's, else ALL).
    tok_pooling_type: str | None = None
    # Apply the pooler's activation: L2 normalisation for embeddings, softmax
    # / sigmoid for classifiers (None: the ST Normalize module's presence for
    # ST embedding dirs, else True).
    use_activation: bool | None = None
    # Embedding models: keep the first `dimensions` values (Matryoshka).
    dimensions: int | None = None
    # Upstream: split inputs longer than the model into chunks and average
    # them. Not built: refused when True.
    enable_chunked_processing: bool = False
    # Upstream: the longest input accepted with chunked processing. Not built.
    max_embed_len: int | None = None
    # Classifiers, affine calibration (Platt scaling): the activation is
    # applied to (logit - logit_mean) / logit_sigma.
    logit_mean: float | None = None
    logit_sigma: float | None = None
    # STEP pooling (process reward models, e.g. math-shepherd): only the rows
    # of the prompt tokens equal to `step_tag_id`, and of those only the
    # columns `returned_token_ids` (e.g. the ids of the "good" and "bad"
    # tokens). Defaults for the requests' PoolingParams; need STEP.
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        check_removed_pooling_task(self.task)
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(
                f"pooler_config.task={self.task!r} is not a pooling task; "
                f"choose one of {POOLING_TASKS}."
            )
        if self.logit_sigma is not None and self.logit_sigma == 0:
            raise ValueError("logit_sigma cannot be 0 (division by zero)")
        self._resolve_pooling_type()
        if self.enable_chunked_processing:
            raise ValueError(
                "pooler_config.enable_chunked_processing=True is not built here: "
                "inputs longer than max_model_len are refused (or truncated with "
                "truncate_prompt_tokens)."
            )
        if self.max_embed_len is not None:
            raise ValueError(
                "pooler_config.max_embed_len is not built here (it belongs to chunked processing)."
            )
        if self.tok_pooling_type is not None:
            self.verify_step_fields()
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"pooler_config.dimensions must be >= 1, got {self.dimensions}.")

    def _resolve_pooling_type(self) -> None:
        """Upper-case the names, check them, and move `pooling_type` into
        seq_pooling_type / tok_pooling_type (upstream's messages)."""
        for name, allowed in (
            ("pooling_type", POOLING_TYPES),
            ("seq_pooling_type", SEQ_POOLING_TYPES),
            ("tok_pooling_type", TOK_POOLING_TYPES),
        ):
            value = getattr(self, name)
            if value is None:
                continue
            value = str(value).upper()
            if value not in allowed:
                raise ValueError(
                    f"pooler_config.{name}={value!r} is not a pooling type; choose one of "
                    f"{allowed}."
                )
            setattr(self, name, value)
        if self.pooling_type is None:
            return
        if self.seq_pooling_type is not None:
            raise ValueError("Cannot set both `pooling_type` and `seq_pooling_type`")
        if self.tok_pooling_type is not None:
            raise ValueError("Cannot set both `pooling_type` and `tok_pooling_type`")
        if self.pooling_type in SEQ_POOLING_TYPES:
            self.seq_pooling_type = self.pooling_type
        else:
            self.tok_pooling_type = self.pooling_type

    @classmethod
    def from_cli(cls, value: str | dict[str, Any] | PoolerConfig) -> PoolerConfig:
        """`--pooler-config` takes a JSON object; unknown keys are refused by name."""
        if isinstance(value, PoolerConfig):
            return value
        data = json.loads(value) if isinstance(value, str) else dict(value)
        if not isinstance(data, dict):
            raise ValueError(f"--pooler-config must be a JSON object, got {value!r}.")
        if "normalize" in data:
            raise ValueError("Parameter `normalize` was removed; use `use_activation` instead.")
        check_removed_pooling_task(data.get("task"))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"--pooler-config: unknown field(s) {unknown}; known: {sorted(known)}."
            )
        return cls(**data)

    def verify_step_fields(self) -> None:
        """step_tag_id / returned_token_ids do something only under STEP
        token pooling: refused by name otherwise. (Called again by ModelConfig
        once the pooling types are resolved.)"""
        for name in ("step_tag_id", "returned_token_ids"):
            if getattr(self, name) is not None and self.tok_pooling_type != "STEP":
                raise ValueError(
                    f"pooler_config.{name} needs pooling_type='STEP' "
                    f"(tok_pooling_type is {self.tok_pooling_type!r})."
                )
        if self.returned_token_ids is not None and not all(
            isinstance(i, int) and i >= 0 for i in self.returned_token_ids
        ):
            raise ValueError(
                f"pooler_config.returned_token_ids must be non-negative ints, "
                f"got {self.returned_token_ids!r}."
            )

    def get_seq_pooling_type(self) -> str:
        if self.seq_pooling_type is None:
            raise ValueError(
                "seq_pooling_type is not set; it should be resolved by"
                " ModelConfig before calling get_seq_pooling_type()"
            )
        return self.seq_pooling_type

    def get_tok_pooling_type(self) -> str:
        if self.tok_pooling_type is None:
            raise ValueError(
                "tok_pooling_type is not set; it should be resolved by"
                " ModelConfig before calling get_tok_pooling_type()"
            )
        return self.tok_pooling_type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def compute_hash(self) -> str:
        # The pooler runs after the hidden states: no compiled graph depends on it.
        return ""
