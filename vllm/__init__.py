"""vLLM: a fast and easy-to-use library for LLM inference and serving.

The public names are imported lazily so that `import vllm` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vllm.version import __version__

_LAZY = {
    "LLM": "vllm.entrypoints.llm",
    "SamplingParams": "vllm.sampling_params",
    "RequestOutput": "vllm.outputs",
    "CompletionOutput": "vllm.outputs",
    "PoolingRequestOutput": "vllm.outputs",
    "PoolingOutput": "vllm.outputs",
    "EmbeddingOutput": "vllm.outputs",
    "EmbeddingRequestOutput": "vllm.outputs",
    "ClassificationOutput": "vllm.outputs",
    "ClassificationRequestOutput": "vllm.outputs",
    "ScoringOutput": "vllm.outputs",
    "ScoringRequestOutput": "vllm.outputs",
    "PoolingParams": "vllm.pooling_params",
    "EngineArgs": "vllm.engine.arg_utils",
    "AsyncEngineArgs": "vllm.engine.arg_utils",
    "TextPrompt": "vllm.inputs",
    "TokensPrompt": "vllm.inputs",
    "PromptType": "vllm.inputs",
    "ModelRegistry": "vllm.model_executor.models.registry",
}

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.entrypoints.llm import LLM
    from vllm.inputs import PromptType, TextPrompt, TokensPrompt
    from vllm.outputs import (
        ClassificationOutput,
        ClassificationRequestOutput,
        CompletionOutput,
        EmbeddingOutput,
        EmbeddingRequestOutput,
        PoolingOutput,
        PoolingRequestOutput,
        RequestOutput,
        ScoringOutput,
        ScoringRequestOutput,
    )
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
