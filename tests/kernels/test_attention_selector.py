"""Attention backend selection by platform, dtype, head size and request."""

from __future__ import annotations

import pytest
import torch

from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.cuda import CudaPlatform
from vllm.v1.attention.backends.registry import AttentionBackendEnum, module_available


def _select(platform, name, head_size=64, dtype=torch.bfloat16):
    return platform.get_attn_backend_cls(name, head_size, dtype, "auto", 16)


def test_cpu_default_and_explicit():
    assert _select(CpuPlatform, None).endswith("CPUAttentionBackend")
    assert _select(CpuPlatform, "cpu_attn").endswith("CPUAttentionBackend")


@pytest.mark.parametrize("name", ["TRITON_ATTN", "FLASHINFER"])
def test_cpu_rejects_gpu_backends(name):
    with pytest.raises(ValueError, match="cannot run on CPU"):
        _select(CpuPlatform, name)


def test_unknown_name():
    with pytest.raises(ValueError, match="Unknown attention backend"):
        _select(CpuPlatform, "NOPE")
    with pytest.raises(ValueError, match="Unknown attention backend"):
        _select(CudaPlatform, "NOPE")


def test_cuda_rules_without_a_gpu():
    """The CUDA platform's choice is a pure function of its inputs."""
    default = _select(CudaPlatform, None)
    if module_available("triton"):
        assert default == AttentionBackendEnum.TRITON_ATTN.get_path()
        assert _select(CudaPlatform, "TRITON_ATTN") == default
    # Head size outside the Triton list: the paged torch backend.
    assert _select(CudaPlatform, None, head_size=40).endswith("CPUAttentionBackend")
    with pytest.raises(ValueError, match="TRITON_ATTN cannot run"):
        _select(CudaPlatform, "TRITON_ATTN", dtype=torch.int8)
    if not module_available("flashinfer"):
        with pytest.raises(ValueError, match="FLASHINFER cannot run here: the optional"):
            _select(CudaPlatform, "FLASHINFER")


def test_backend_classes_resolve():
    import importlib

    for member in AttentionBackendEnum:
        mod, _, cls = member.get_path().rpartition(".")
        backend = getattr(importlib.import_module(mod), cls)
        assert backend.get_name() == member.name
        assert backend.get_kv_cache_shape(3, 16, 2, 64) in ((2, 3, 16, 2, 64), (3, 2, 16, 2, 64))


def test_attention_backend_flag_reaches_the_selector(monkeypatch):
    """`--attention-backend` lands in VllmConfig.attention_config and wins over
    VLLM_ATTENTION_BACKEND while that config is current."""
    from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.selector import _requested_backend

    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(
        ["--attention-backend", "cpu_attn"]
    )
    assert EngineArgs.from_cli_args(args).attention_backend == "cpu_attn"
    assert AttentionConfig(backend="cpu_attn").backend == "CPU_ATTN"
    with pytest.raises(ValueError, match="Unknown attention backend 'NOPE'"):
        AttentionConfig(backend="NOPE")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    assert _requested_backend() == "TRITON_ATTN"
    with set_current_vllm_config(VllmConfig(attention_config=AttentionConfig("FLASHINFER"))):
        assert _requested_backend() == "FLASHINFER"
    with set_current_vllm_config(VllmConfig()):
        assert _requested_backend() == "TRITON_ATTN"  # no flag: the variable
