"""Generative model classes turned into pooling ones (upstream:
vllm/model_executor/models/adapters.py).

`as_embedding_model(LlamaForCausalLM)` keeps the decoder body, drops the LM
head and adds `pooler = DispatchPooler.for_embedding(pooler_config)` (LAST
pooling by default: Qwen3-Embedding style). `as_seq_cls_model` adds a
`score` layer [num_labels, hidden] (no bias, in the head dtype, as HF's
*ForSequenceClassification) and `DispatchPooler.for_seq_cls` over it. The
model loader applies them for `--convert embed / classify / reward`; the
registry's *ForSequenceClassification entries are `as_seq_cls_model` of the
family's causal LM. `as_reward_model` (`--convert reward`) keeps the body
and returns every prompt token's row (task token_classify, `LLM.reward`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

import torch.nn as nn

from vllm.logger import init_logger
from vllm.model_executor.layers.pooler.projector import _load_st_projector

__all__ = ["_load_st_projector", "as_embedding_model", "as_reward_model", "as_seq_cls_model"]

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = init_logger(__name__)

_T = TypeVar("_T", bound=type[nn.Module])


def _drop_lm_head(model: nn.Module) -> None:
    for attr in ("lm_head", "logits_processor"):
        if hasattr(model, attr):
            delattr(model, attr)


def _pooling_load_weights(model: nn.Module, weights: Any) -> set[str]:
    """The LM head's weights are skipped. A base-model checkpoint
    (`Qwen3Model`, as sentence-transformers saves it) names the body's weights
    without the body prefix ("layers.0..." for "model.layers.0..."): they get it."""
    from vllm.model_executor.models.utils import AutoWeightsLoader

    body = getattr(model, "body_name", "model")
    own = {name for name, _ in model.named_children()}

    def mapped() -> Any:
        for name, tensor in weights:
            if name.startswith("lm_head."):
                continue  # dropped with the LM head
            if name.split(".", 1)[0] not in own:
                name = f"{body}.{name}"
            yield name, tensor

    return AutoWeightsLoader(model, skip_prefixes=["lm_head."]).load_weights(mapped())


def _pooler_config(vllm_config: VllmConfig):  # noqa: ANN202 - PoolerConfig
    model_config = vllm_config.model_config
    assert model_config is not None and model_config.pooler_config is not None, (
        "a pooling model needs model_config.pooler_config (runner='pooling')"
    )
    return model_config.pooler_config


def _create_pooling_model_cls(cls: _T) -> type[Any]:
    """`cls` (a generative model class) without its LM head, loading weights
    per `_pooling_load_weights`; the subclass builds `self.pooler` (and any
    head of its own) in `_init_pooler`, as upstream's adapters do."""
    base = cast(type[Any], cls)

    class ModelForPooling(base):  # type: ignore[misc, valid-type]
        is_pooling_model: ClassVar[bool] = True

        def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **kwargs: Any) -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
            _drop_lm_head(self)
            self._init_pooler(vllm_config)

        def _init_pooler(self, vllm_config: VllmConfig) -> None:
            raise NotImplementedError

        def load_weights(self, weights: Any) -> set[str]:
            return _pooling_load_weights(self, weights)

    return ModelForPooling


def _named(model_cls: type[Any], cls: type[nn.Module], suffix: str) -> Any:
    """`model_cls` named after the generative class: LlamaForCausalLM -> Llama<suffix>."""
    model_cls.__name__ = model_cls.__qualname__ = cls.__name__.removesuffix("ForCausalLM") + suffix
    return model_cls


def as_embedding_model(cls: _T) -> _T:
    """A pooling model for embeddings from a generative model class."""
    from vllm.model_executor.layers.pooler import DispatchPooler

    class ModelForEmbedding(_create_pooling_model_cls(cls)):  # type: ignore[misc]
        default_pooling_type: ClassVar[str] = "LAST"

        def _init_pooler(self, vllm_config: VllmConfig) -> None:
            self.pooler = DispatchPooler.for_embedding(_pooler_config(vllm_config))

    return cast(_T, _named(ModelForEmbedding, cls, "EmbeddingModel"))


def as_seq_cls_model(cls: _T) -> _T:
    """A sequence classifier (HF *ForSequenceClassification: a bias-free
    `score` Linear over the last token's hidden state) from a generative
    model class."""
    from vllm.model_executor.layers.pooler import DispatchPooler

    class ModelForSequenceClassification(_create_pooling_model_cls(cls)):  # type: ignore[misc]
        # Scores text pairs (LLM.score), as upstream's SupportsCrossEncoding.
        supports_cross_encoding: ClassVar[bool] = True
        default_pooling_type: ClassVar[str] = "LAST"

        def _init_pooler(self, vllm_config: VllmConfig) -> None:
            model_config = vllm_config.model_config
            assert model_config is not None
            num_labels = int(getattr(model_config.hf_config, "num_labels", 0) or 0)
            if num_labels < 1:
                raise ValueError(
                    f"{model_config.model}: a classifier needs config.num_labels >= 1."
                )
            self.score = nn.Linear(
                model_config.get_hidden_size(),
                num_labels,
                bias=False,
                dtype=model_config.head_dtype,
            )
            self.pooler = DispatchPooler.for_seq_cls(
                _pooler_config(vllm_config), classifier=self.score
            )

    return cast(_T, _named(ModelForSequenceClassification, cls, "ForSequenceClassification"))


def as_reward_model(cls: _T) -> _T:
    """A reward model from a generative model class (upstream's
    as_reward_model): the decoder body without its LM head, and one task,
    token_classify, over every prompt token's hidden state (ALL pooling; STEP
    keeps the step-tag rows). No score layer: a row is the hidden state, with
    the classifier activation (softmax over it) unless use_activation=False."""
    from vllm.model_executor.layers.pooler import DispatchPooler, PoolerClassify
    from vllm.model_executor.layers.pooler.tokwise import pooler_for_token_classify

    class ModelForReward(_create_pooling_model_cls(cls)):  # type: ignore[misc]
        default_pooling_type: ClassVar[str] = "ALL"

        def _init_pooler(self, vllm_config: VllmConfig) -> None:
            # Softmax over each row's own width (upstream: static_num_labels=False).
            pooler = pooler_for_token_classify(
                _pooler_config(vllm_config), act_fn=PoolerClassify(num_labels=None)
            )
            self.pooler = DispatchPooler({"token_classify": pooler})

    return cast(_T, _named(ModelForReward, cls, "ForReward"))
