"""Types shared by the poolers (upstream: vllm/model_executor/layers/pooler/common.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import torch

from vllm.pooling_params import PoolingParams

ProjectorFn = Callable[[torch.Tensor], torch.Tensor]
ClassifierFn = Callable[[torch.Tensor], torch.Tensor]
ActivationFn = Callable[[torch.Tensor], torch.Tensor]


class PoolingType(IntEnum):
    """Which hidden states a pooler reads: the last token's, all tokens',
    the first (CLS) token's, the step-tag tokens' (STEP, not built), or the
    mean over the prompt."""

    LAST = 0
    ALL = 1
    CLS = 2
    STEP = 3
    MEAN = 4


@dataclass(frozen=True)
class PoolingParamsUpdate:
    """What a pooler needs set on the requests it serves."""

    requires_token_ids: bool = False

    def __or__(self, other: PoolingParamsUpdate) -> PoolingParamsUpdate:
        return PoolingParamsUpdate(
            requires_token_ids=self.requires_token_ids or other.requires_token_ids
        )

    def apply(self, params: PoolingParams) -> None:
        params.requires_token_ids = self.requires_token_ids
