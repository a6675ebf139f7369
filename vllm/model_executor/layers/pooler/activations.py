"""Output activations of poolers (upstream:
vllm/model_executor/layers/pooler/activations.py).

Embedding heads L2-normalise; classifier heads apply softmax over the labels
(two or more labels) or a sigmoid (one label, or multi-label problems), as
transformers' pipelines and sentence-transformers' CrossEncoder do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from vllm.config.model import ModelConfig


class PoolerActivation(nn.Module):
    """Applied row-wise to [N, D] (or per tensor of a list)."""

    def forward_chunk(self, pooled_data: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, pooled_data: torch.Tensor) -> torch.Tensor:
        # Activations run in float32 whatever the head dtype.
        return self.forward_chunk(pooled_data.float()).to(pooled_data.dtype)


class PoolerIdentity(PoolerActivation):
    def forward_chunk(self, pooled_data: torch.Tensor) -> torch.Tensor:
        return pooled_data


class PoolerNormalize(PoolerActivation):
    def forward_chunk(self, pooled_data: torch.Tensor) -> torch.Tensor:
        return F.normalize(pooled_data, p=2, dim=-1)


class PoolerMultiLabelClassify(PoolerActivation):
    def forward_chunk(self, pooled_data: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(pooled_data)


class PoolerClassify(PoolerActivation):
    """Softmax over the labels, or a sigmoid when there is one label."""

    def __init__(self, num_labels: int | None = None) -> None:
        super().__init__()
        self.num_labels = num_labels

    def forward_chunk(self, pooled_data: torch.Tensor) -> torch.Tensor:
        num_labels = self.num_labels if self.num_labels is not None else pooled_data.shape[-1]
        if num_labels < 2:
            return torch.sigmoid(pooled_data)
        return torch.softmax(pooled_data, dim=-1)


class LambdaPoolerActivation(PoolerActivation):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward_chunk(self, pooled_data: torch.Tensor) -> torch.Tensor:
        return self.fn(pooled_data)


# sentence-transformers CrossEncoder activation names -> activations.
_ST_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": PoolerMultiLabelClassify,
    "torch.nn.modules.linear.Identity": PoolerIdentity,
}


def get_classification_act_fn(config: Any) -> PoolerActivation:
    """From a HF config: a multi-label problem -> sigmoid; else by num_labels."""
    if getattr(config, "problem_type", None) == "multi_label_classification":
        return PoolerMultiLabelClassify()
    return PoolerClassify(num_labels=getattr(config, "num_labels", None))


def get_cross_encoder_act_fn(config: Any) -> PoolerActivation:
    """A sentence-transformers CrossEncoder's activation (its config's
    `sentence_transformers.activation_fn` or the older
    `sbert_ce_default_activation_function`), else by num_labels."""
    st = getattr(config, "sentence_transformers", None) or {}
    name = st.get("activation_fn") if isinstance(st, dict) else None
    name = name or getattr(config, "sbert_ce_default_activation_function", None)
    if name is not None:
        if name not in _ST_ACTIVATIONS:
            raise ValueError(f"The cross-encoder activation {name!r} is not built here.")
        return _ST_ACTIVATIONS[name]()
    return get_classification_act_fn(config)


def resolve_classifier_act_fn(
    model_config: ModelConfig, act_fn: PoolerActivation | None = None
) -> PoolerActivation:
    if act_fn is not None:
        return act_fn
    return get_cross_encoder_act_fn(model_config.hf_config)
