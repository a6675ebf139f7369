"""Loads a .gguf file by dequantizing every tensor to the model dtype
(upstream: vllm/model_executor/model_loader/gguf_loader.py).

Upstream keeps GGUF weights quantized and runs GGUF matmul kernels; no such
kernel exists here, so the weights are dequantized once at load time and the
model runs as an ordinary dense model.

GGUF names tensors its own way ("blk.0.attn_q.weight"); the `gguf` package's
name map translates HF module names to GGUF ones, so we list the HF names the
model expects (fused parameters expanded through `packed_modules_mapping`),
invert the map, and feed HF-named tensors to the model's `load_weights`.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import TYPE_CHECKING

import torch
from torch import nn

from vllm.logger import init_logger
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.utils import load_model_weights

if TYPE_CHECKING:
    from vllm.config import ModelConfig

logger = init_logger(__name__)

# GGUF tensors that carry nothing the model needs (recomputed here).
_IGNORED_GGUF_TENSORS = ("rope_freqs.weight",)


def _reverse_llama_qk_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp stores Llama q/k rows permuted for its interleaved rotary
    (per head: [pairs of (i, i + d/2)]); undo it to get HF's half-split order."""
    rows = w.shape[0]
    dim = rows // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


class GGUFModelLoader(BaseModelLoader):
    """Model loader for a local single-file .gguf checkpoint."""

    def _gguf_path(self, model_config: ModelConfig) -> str:
        path = getattr(model_config, "gguf_file", None) or model_config.model
        if not (os.path.isfile(path) and path.endswith(".gguf")):
            raise ValueError(f"GGUF loading needs a local .gguf file, got {path!r}.")
        return path

    def download_model(self, model_config: ModelConfig) -> None:
        self._gguf_path(model_config)

    def _gguf_to_hf_name_map(
        self, model: nn.Module, model_config: ModelConfig, gguf_arch: str
    ) -> dict[str, str]:
        import gguf

        arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch), None)
        if arch is None:
            raise ValueError(f"Unknown GGUF architecture {gguf_arch!r}.")
        num_layers = model_config.hf_text_config.num_hidden_layers
        name_map = gguf.get_tensor_name_map(arch, num_layers)
        packed = getattr(model, "packed_modules_mapping", {})
        gguf_to_hf: dict[str, str] = {}
        for param_name, _ in model.named_parameters():
            for hf_name in _expand_packed(param_name, packed):
                module_name, _, suffix = hf_name.rpartition(".")
                gguf_name = name_map.get_name(module_name)
                if gguf_name is None:
                    raise ValueError(f"No GGUF tensor name for parameter {hf_name!r}.")
                gguf_to_hf[f"{gguf_name}.{suffix}"] = hf_name
        return gguf_to_hf

    def _weights_iterator(
        self, path: str, model: nn.Module, model_config: ModelConfig
    ) -> Generator[tuple[str, torch.Tensor], None, None]:
        from vllm.transformers_utils.gguf_utils import read_gguf

        gguf_file = read_gguf(path)
        gguf_arch = gguf_file.architecture
        name_map = self._gguf_to_hf_name_map(model, model_config, gguf_arch)
        cfg = model_config.hf_text_config
        dtype = model_config.dtype
        for info in gguf_file.tensors:
            hf_name = name_map.get(info.name)
            if hf_name is None:
                if info.name not in _IGNORED_GGUF_TENSORS:
                    logger.warning("Skipping GGUF tensor %s: no matching parameter.", info.name)
                continue
            # Dequantized as float32 [rows, cols] in HF orientation ([out, in]).
            w = torch.from_numpy(gguf_file.tensor_data(info))
            if gguf_arch == "llama" and ".attn_q." in info.name:
                w = _reverse_llama_qk_permute(w, cfg.num_attention_heads)
            elif gguf_arch == "llama" and ".attn_k." in info.name:
                w = _reverse_llama_qk_permute(w, cfg.num_key_value_heads)
            yield hf_name, w.to(dtype)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        path = self._gguf_path(model_config)
        weights_to_load = {name for name, _ in model.named_parameters()}
        loaded = load_model_weights(model, self._weights_iterator(path, model, model_config))
        missing = weights_to_load - loaded
        if missing:
            raise ValueError(
                f"Following weights were not initialized from {path}: {sorted(missing)}"
            )


def _expand_packed(param_name: str, packed: dict[str, list[str]]) -> list[str]:
    """ "...qkv_proj.weight" -> ["...q_proj.weight", "...k_proj.weight", "...v_proj.weight"]."""
    for fused, parts in packed.items():
        if f".{fused}." in param_name:
            return [param_name.replace(f".{fused}.", f".{part}.") for part in parts]
    return [param_name]
