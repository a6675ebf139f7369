"""Loads a .gguf file, keeping its quantized tensors quantized
(upstream: vllm/model_executor/model_loader/gguf_loader.py).

Before the model is built, the file's tensor types are handed to the
`GGUFConfig` (layers/quantization/gguf.py), so each linear / embedding layer
registers `qweight` (uint8 [rows, row bytes]: the raw ggml blocks) and, for a
linear, `qweight_type` (int32 [rows]: the ggml type of each row). The loader
then yields, per quantized tensor, its raw rows as `<module>.qweight` and its
type vector as `<module>.qweight_type`; the layers' own loaders shard them and
the layers decode them once loaded. F32 / F16 / BF16 tensors (norms, dense
layers) are yielded as float tensors in the model dtype; a quantized tensor
for a dense parameter is refused (never dequantized).

GGUF names tensors its own way ("blk.0.attn_q.weight"); the `gguf` package's
name map translates HF module names to GGUF ones, so we list the HF names the
model expects (fused parameters expanded through `packed_modules_mapping`),
invert the map, and feed HF-named tensors to the model's `load_weights`.
Llama's q / k rows are stored permuted by llama.cpp; whole rows are moved back
(quantized rows too: a row is a whole number of blocks).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from vllm.logger import init_logger
from vllm.model_executor.layers.quantization.utils.gguf_quants import (
    GGML_DENSE_TYPES,
    ggml_type_name,
    gguf_row_bytes,
)
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.utils import load_model_weights

if TYPE_CHECKING:
    from vllm.config import ModelConfig, VllmConfig
    from vllm.transformers_utils.gguf_utils import GGUFFile, GGUFTensorInfo

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

    def load_model(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = ""
    ) -> nn.Module:
        """Tell the GGUF quant config the file's tensor types (upstream fills
        its `unquantized_modules` here), then build and load as usual."""
        from vllm.model_executor.layers.quantization.gguf import GGUFConfig
        from vllm.transformers_utils.gguf_utils import read_gguf

        quant_config = vllm_config.quant_config
        if isinstance(quant_config, GGUFConfig):
            path = self._gguf_path(model_config)
            gguf_file = read_gguf(path)
            name_map = _tensor_name_map(
                gguf_file.architecture, model_config.hf_text_config.num_hidden_layers
            )
            types = {info.name: info.ggml_type for info in gguf_file.tensors}
            quant_config.set_gguf_tensors(path, types, name_map)
        return super().load_model(vllm_config, model_config, prefix)

    def _gguf_to_hf_modules(
        self, model: nn.Module, model_config: ModelConfig, gguf_arch: str
    ) -> tuple[dict[str, str], dict[str, set[str]]]:
        """(GGUF module name -> HF module name, HF module name -> the parameter
        names it has: "weight", "bias", "qweight", "qweight_type")."""
        name_map = _tensor_name_map(gguf_arch, model_config.hf_text_config.num_hidden_layers)
        packed = getattr(model, "packed_modules_mapping", {})
        gguf_to_hf: dict[str, str] = {}
        suffixes: dict[str, set[str]] = {}
        for param_name, _ in model.named_parameters():
            for hf_name in _expand_packed(param_name, packed):
                module_name, _, suffix = hf_name.rpartition(".")
                gguf_name = name_map.get_name(module_name)
                if gguf_name is None:
                    raise ValueError(f"No GGUF tensor name for parameter {hf_name!r}.")
                gguf_to_hf[gguf_name] = module_name
                suffixes.setdefault(module_name, set()).add(suffix)
        return gguf_to_hf, suffixes

    def _weights_iterator(
        self, path: str, model: nn.Module, model_config: ModelConfig
    ) -> Generator[tuple[str, torch.Tensor], None, None]:
        from vllm.transformers_utils.gguf_utils import read_gguf

        gguf_file = read_gguf(path)
        gguf_arch = gguf_file.architecture
        modules, suffixes = self._gguf_to_hf_modules(model, model_config, gguf_arch)
        cfg = model_config.hf_text_config
        for info in gguf_file.tensors:
            gguf_module, _, suffix = info.name.rpartition(".")
            hf_module = modules.get(gguf_module)
            if hf_module is None:
                if info.name not in _IGNORED_GGUF_TENSORS:
                    logger.warning("Skipping GGUF tensor %s: no matching parameter.", info.name)
                continue
            has = suffixes[hf_module]
            quantized = suffix == "weight" and "qweight" in has
            if quantized:
                w = _raw_rows(gguf_file, info)
            elif suffix in has and info.ggml_type in GGML_DENSE_TYPES:
                # Dequantized as float32 [rows, cols] in HF orientation ([out, in]).
                w = torch.from_numpy(gguf_file.tensor_data(info)).to(model_config.dtype)
            else:
                raise ValueError(
                    f"{path}: tensor {info.name} ({ggml_type_name(info.ggml_type)}) has no "
                    f"matching parameter in {hf_module} (quantized tensors load into "
                    "quantized layers only; they are never dequantized)."
                )
            if gguf_arch == "llama" and ".attn_q." in info.name:
                w = _reverse_llama_qk_permute(w, cfg.num_attention_heads)
            elif gguf_arch == "llama" and ".attn_k." in info.name:
                w = _reverse_llama_qk_permute(w, cfg.num_key_value_heads)
            if not quantized:
                yield f"{hf_module}.{suffix}", w
                continue
            yield f"{hf_module}.qweight", w
            if "qweight_type" in has:
                yield (
                    f"{hf_module}.qweight_type",
                    torch.full((w.shape[0],), info.ggml_type, dtype=torch.int32),
                )

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        path = self._gguf_path(model_config)
        weights_to_load = {name for name, _ in model.named_parameters()}
        loaded = load_model_weights(model, self._weights_iterator(path, model, model_config))
        missing = weights_to_load - loaded
        if missing:
            raise ValueError(
                f"Following weights were not initialized from {path}: {sorted(missing)}"
            )


def _tensor_name_map(gguf_arch: str, num_layers: int) -> Any:
    """The gguf package's TensorNameMap of this architecture (HF -> GGUF names)."""
    import gguf

    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == gguf_arch), None)
    if arch is None:
        raise ValueError(f"Unknown GGUF architecture {gguf_arch!r}.")
    return gguf.get_tensor_name_map(arch, num_layers)


def _raw_rows(gguf_file: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """A quantized 2-D tensor's bytes as uint8 [rows, row bytes] (a copy)."""
    if len(info.shape) != 2:
        raise ValueError(
            f"{gguf_file.path}: quantized tensor {info.name} has shape {info.shape}; "
            "only 2-D quantized tensors are built."
        )
    rows, cols = info.shape
    row_bytes = gguf_row_bytes(info.ggml_type, cols)
    raw = np.memmap(
        gguf_file.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(rows, row_bytes)
    )
    return torch.from_numpy(np.array(raw))


def _expand_packed(param_name: str, packed: dict[str, list[str]]) -> list[str]:
    """ "...qkv_proj.weight" -> ["...q_proj.weight", "...k_proj.weight", "...v_proj.weight"]."""
    for fused, parts in packed.items():
        if f".{fused}." in param_name:
            return [param_name.replace(f".{fused}.", f".{part}.") for part in parts]
    return [param_name]
