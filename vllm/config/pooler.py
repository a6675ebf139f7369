"""Pooler configuration (upstream: vllm/config/pooler.py).

Set with `--pooler-config '{"pooling_type": "MEAN", ...}'` (or
`LLM(pooler_config=...)`); fields left None take the sentence-transformers
files' values, then the model's defaults (resolved by ModelConfig).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from vllm.logger import init_logger

logger = init_logger(__name__)

PoolingTypeStr = Literal["LAST", "ALL", "CLS", "STEP", "MEAN"]
POOLING_TYPES: tuple[str, ...] = ("LAST", "ALL", "CLS", "STEP", "MEAN")


@dataclass
class PoolerConfig:
    """Controls the behavior of output pooling in pooling models."""

    # The pooling method; None: the sentence-transformers config's, else the
    # model class's default.
    pooling_type: str | None = None
    # Older upstream's embedding switch; folded into use_activation (an
    # embedding's activation is its L2 normalisation).
    normalize: bool | None = None
    # Embedding models: keep the first `dimensions` values (Matryoshka).
    dimensions: int | None = None
    # Upstream: split inputs longer than the model into chunks and average
    # them. Not built: refused when True.
    enable_chunked_processing: bool | None = None
    # Upstream: the longest input accepted with chunked processing. Not built.
    max_embed_len: int | None = None
    # Apply the pooler's activation: L2 normalisation for embeddings, softmax /
    # sigmoid for classifiers (None: True). `softmax` and `activation` are
    # upstream's deprecated spellings.
    softmax: bool | None = None
    activation: bool | None = None
    use_activation: bool | None = None
    # Classification models: subtracted from the logits before the activation.
    logit_bias: float | None = None
    # STEP pooling (process reward models, e.g. math-shepherd): only the rows
    # of the prompt tokens equal to `step_tag_id`, and of those only the
    # columns `returned_token_ids` (e.g. the ids of the "good" and "bad"
    # tokens). Defaults for the requests' PoolingParams; need pooling_type STEP.
    step_tag_id: int | None = None
    returned_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        self.use_activation = get_use_activation(self)
        if self.normalize is not None and self.use_activation is None:
            self.use_activation = bool(self.normalize)
        if self.pooling_type is not None:
            self.pooling_type = str(self.pooling_type).upper()
            if self.pooling_type not in POOLING_TYPES:
                raise ValueError(
                    f"pooler_config.pooling_type={self.pooling_type!r} is not a pooling "
                    f"type; choose one of {POOLING_TYPES}."
                )
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
        if self.pooling_type is not None:
            self.verify_step_fields()
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"pooler_config.dimensions must be >= 1, got {self.dimensions}.")

    @classmethod
    def from_cli(cls, value: str | dict[str, Any] | PoolerConfig) -> PoolerConfig:
        """`--pooler-config` takes a JSON object; unknown keys are refused by name."""
        if isinstance(value, PoolerConfig):
            return value
        data = json.loads(value) if isinstance(value, str) else dict(value)
        if not isinstance(data, dict):
            raise ValueError(f"--pooler-config must be a JSON object, got {value!r}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"--pooler-config: unknown field(s) {unknown}; known: {sorted(known)}."
            )
        return cls(**data)

    def verify_step_fields(self) -> None:
        """step_tag_id / returned_token_ids do something only under STEP
        pooling: refused by name with another pooling type. (Called again by
        ModelConfig once pooling_type is resolved.)"""
        for name in ("step_tag_id", "returned_token_ids"):
            if getattr(self, name) is not None and self.pooling_type != "STEP":
                raise ValueError(
                    f"pooler_config.{name} needs pooling_type='STEP' "
                    f"(pooling_type is {self.pooling_type!r})."
                )
        if self.returned_token_ids is not None and not all(
            isinstance(i, int) and i >= 0 for i in self.returned_token_ids
        ):
            raise ValueError(
                f"pooler_config.returned_token_ids must be non-negative ints, "
                f"got {self.returned_token_ids!r}."
            )

    def get_pooling_type(self) -> str:
        assert self.pooling_type is not None, "Should be resolved by ModelConfig"
        return self.pooling_type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def compute_hash(self) -> str:
        # The pooler runs after the hidden states: no compiled graph depends on it.
        return ""


def get_use_activation(o: object) -> bool | None:
    """`use_activation`, or its deprecated spellings `softmax` / `activation`."""
    for old in ("softmax", "activation"):
        value = getattr(o, old, None)
        if value is not None:
            logger.warning_once(
                "%s will be deprecated and will be removed; use use_activation instead.", old
            )
            return bool(value)
    return getattr(o, "use_activation", None)
