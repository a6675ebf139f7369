"""`-q/--quantization` as upstream resolves it: inferred from the checkpoint's
quantization_config, a contradicting or unbuilt value refused at start-up by
name, and every compressed-tensors scheme without a kernel here refused
(never dequantized)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.quantization.ct_utils import quantization_config, write_compressed
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
    CompressedTensorsConfig,
)


@pytest.fixture(scope="module")
def ct_dir(tiny_model_dir, tmp_path_factory):
    dst = str(tmp_path_factory.mktemp("ct-w8a16"))
    write_compressed(tiny_model_dir("llama"), dst, None, bits=8, group=None)
    return dst


def _config(model: str, **kwargs):
    return EngineArgs(model=model, **kwargs).create_engine_config()


def _with_quant_config(src: str, dst: str, quant_cfg: dict) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quant_cfg
    with open(path, "w") as f:
        json.dump(cfg, f)
    return dst


def test_inferred_from_the_checkpoint(ct_dir):
    config = _config(ct_dir)
    assert config.model_config.quantization == "compressed-tensors"
    assert isinstance(config.quant_config, CompressedTensorsConfig)
    # Saying what the checkpoint is is accepted.
    assert _config(ct_dir, quantization="compressed-tensors").quant_config is not None


def test_unquantized_checkpoint_has_no_quant_config(tiny_model_dir):
    config = _config(tiny_model_dir("llama"))
    assert config.model_config.quantization is None
    assert config.quant_config is None


def test_gguf_file_resolves_to_gguf(embedded_model_path):
    assert _config(embedded_model_path).model_config.quantization == "gguf"
    quant_config = _config(embedded_model_path, quantization="gguf").quant_config
    assert type(quant_config).__name__ == "GGUFConfig" and quant_config.get_name() == "gguf"


def test_contradicting_value_is_refused(ct_dir, embedded_model_path):
    with pytest.raises(ValueError, match=r"does not match.*-q/--quantization gguf"):
        _config(ct_dir, quantization="gguf")
    with pytest.raises(ValueError, match=r"model config \(gguf\) does not match"):
        _config(embedded_model_path, quantization="compressed-tensors")


def test_value_without_a_quantized_checkpoint_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="has no quantization_config"):
        _config(tiny_model_dir("llama"), quantization="compressed-tensors")


@pytest.mark.parametrize("method", ["bitsandbytes", "hqq", "modelopt"])
def test_unbuilt_method_is_refused_by_name(tiny_model_dir, method):
    assert method in QUANTIZATION_METHODS
    with pytest.raises(ValueError, match=rf"{method!r} is not built here \(built: compressed"):
        _config(tiny_model_dir("llama"), quantization=method)


def test_unknown_method_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="'int3' .* is not a known method"):
        _config(tiny_model_dir("llama"), quantization="int3")


def test_unbuilt_checkpoint_method_is_refused(tiny_model_dir, tmp_path):
    hqq = {"quant_method": "hqq", "nbits": 4, "group_size": 64}
    model = _with_quant_config(tiny_model_dir("llama"), str(tmp_path / "hqq"), hqq)
    with pytest.raises(ValueError, match="quant_method='hqq'.*not built"):
        _config(model)


def _group(cfg: dict) -> dict:
    return cfg["config_groups"]["group_0"]


def _w8a8_static(cfg: dict) -> None:
    _int_quantized(cfg)
    _group(cfg)["input_activations"] = {"num_bits": 8, "type": "int", "dynamic": False}


def _w8a8_packed(cfg: dict) -> None:
    _group(cfg)["input_activations"] = {"num_bits": 8, "type": "int", "dynamic": True}


def _w8a8_fp8(cfg: dict) -> None:
    _group(cfg)["input_activations"] = {"num_bits": 8, "type": "float", "dynamic": True}


def _fp8(cfg: dict) -> None:
    _group(cfg)["weights"]["type"] = "float"


def _int_quantized(cfg: dict) -> None:
    cfg["format"] = _group(cfg)["format"] = "int-quantized"


def _asym(cfg: dict) -> None:
    _group(cfg)["weights"]["symmetric"] = False


def _w4_channel(cfg: dict) -> None:
    _group(cfg)["weights"].update(num_bits=4, strategy="channel", group_size=None)


def _w8_group(cfg: dict) -> None:
    _group(cfg)["weights"].update(strategy="group", group_size=128)


def _w4_g16(cfg: dict) -> None:
    _group(cfg)["weights"].update(num_bits=4, strategy="group", group_size=16)


def _actorder(cfg: dict) -> None:
    _group(cfg)["weights"]["actorder"] = "group"


def _kv_cache(cfg: dict) -> None:
    cfg["kv_cache_scheme"] = {"num_bits": 8, "type": "float"}


def _sparse(cfg: dict) -> None:
    cfg["sparsity_config"] = {"format": "sparse-24-bitmask"}


UNBUILT = {
    "w8a8-static": (_w8a8_static, "static activation quantization"),
    "w8a8-pack-quantized": (_w8a8_packed, "W8A8 in format 'pack-quantized'"),
    "fp8-dynamic": (_w8a8_fp8, "activations of type 'float'"),
    "fp8-pack-quantized": (_fp8, "FP8 weights in format 'pack-quantized'"),
    "int-quantized": (_int_quantized, "format 'int-quantized' for weight-only"),
    "asymmetric-w8": (_asym, "W8A16 with asymmetric weights is not built"),
    "w4-channel": (_w4_channel, "W4A16 with strategy 'channel'"),
    "w8-group": (_w8_group, "W8A16 with strategy 'group'"),
    "w4-group16": (_w4_g16, "group_size=16"),
    "actorder": (_actorder, "actorder='group'"),
    "kv-cache": (_kv_cache, "kv_cache_scheme"),
    "sparse": (_sparse, "sparsity format 'sparse-24-bitmask'"),
}


@pytest.mark.parametrize("scheme", list(UNBUILT))
def test_unbuilt_scheme_is_refused_at_start_up(tiny_model_dir, tmp_path, scheme):
    edit, message = UNBUILT[scheme]
    cfg = quantization_config(8, None)
    edit(cfg)
    model = _with_quant_config(tiny_model_dir("llama"), str(tmp_path / scheme), cfg)
    with pytest.raises(ValueError, match=message):
        _config(model)


def test_get_quantization_config():
    assert get_quantization_config("compressed-tensors") is CompressedTensorsConfig
    with pytest.raises(ValueError, match="'hqq' is not built"):
        get_quantization_config("hqq")


def test_device_without_kernels_is_refused(ct_dir):
    """The compressed-tensors kernels here are torch's CPU ones: another
    device is refused when the config is parsed, not served dequantized."""
    from vllm.config import VllmConfig

    model_config = _config(ct_dir).model_config
    assert VllmConfig._get_quantization_config(model_config, "cpu") is not None
    with pytest.raises(ValueError, match="CPU kernels only here; the cuda kernels are not built"):
        VllmConfig._get_quantization_config(model_config, "cuda")
