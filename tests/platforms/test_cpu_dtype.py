"""dtype="auto" on CPUs with and without native bf16 (issue 21 item 2).

The capability is read at one place, `vllm.platforms.cpu_capability.cpu_has_native_bf16`;
these tests fake it there (and its /proc/cpuinfo parsing is checked on
written cpuinfo files)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from transformers import LlamaConfig

from vllm.config import ModelConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import _log_once
from vllm.platforms import cpu_capability as cpu_platform

_WHY = "this CPU has no native bf16"


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory) -> dict[str, str]:
    """A config-only tiny Llama per checkpoint dtype (ModelConfig reads no weights)."""
    dirs = {}
    for name in ("bfloat16", "float16", "float32"):
        path = tmp_path_factory.mktemp(f"tiny-llama-{name}")
        LlamaConfig(
            vocab_size=256,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=256,
            dtype=name,
            architectures=["LlamaForCausalLM"],
        ).save_pretrained(path)
        dirs[name] = str(path)
    return dirs


@pytest.fixture
def logs() -> Iterator[list[str]]:
    """Messages logged under `vllm` (propagation is off; `*_once` cache cleared)."""
    records: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Handler()
    _log_once.cache_clear()
    logging.getLogger("vllm").addHandler(handler)
    yield records
    logging.getLogger("vllm").removeHandler(handler)


def _fake_cpu(monkeypatch, native_bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(cpu_platform, "cpu_has_native_bf16", lambda: native_bf16)


@pytest.mark.parametrize("ckpt", ["bfloat16", "float16", "float32"])
def test_auto_is_float32_without_native_bf16(monkeypatch, config_dirs, logs, ckpt):
    _fake_cpu(monkeypatch, native_bf16=False)
    assert ModelConfig(model=config_dirs[ckpt]).dtype is torch.float32
    said = [m for m in logs if _WHY in m]
    assert len(said) == 1, logs
    assert "torch.float32" in said[0] and f"torch.{ckpt}" in said[0]
    assert "--dtype bfloat16" in said[0]
    # Said once: a second config of the same checkpoint logs nothing new.
    assert ModelConfig(model=config_dirs[ckpt]).dtype is torch.float32
    assert len([m for m in logs if _WHY in m]) == 1


def test_explicit_dtype_still_wins_without_native_bf16(monkeypatch, config_dirs, logs):
    _fake_cpu(monkeypatch, native_bf16=False)
    for asked, expected in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        assert ModelConfig(model=config_dirs["bfloat16"], dtype=asked).dtype is expected
    assert ModelConfig(model=config_dirs["float32"], dtype=torch.bfloat16).dtype is torch.bfloat16
    # Through the CLI's path as well (--dtype bfloat16).
    args = EngineArgs(model=config_dirs["bfloat16"], dtype="bfloat16", device="cpu")
    mc = args.create_engine_config().model_config
    assert mc is not None and mc.dtype is torch.bfloat16
    assert not [m for m in logs if _WHY in m]


@pytest.mark.parametrize(
    ("ckpt", "expected"),
    [("bfloat16", torch.bfloat16), ("float16", torch.bfloat16), ("float32", torch.bfloat16)],
)
def test_native_bf16_cpu_keeps_todays_rule(monkeypatch, config_dirs, logs, ckpt, expected):
    _fake_cpu(monkeypatch, native_bf16=True)
    assert ModelConfig(model=config_dirs[ckpt]).dtype is expected
    assert ModelConfig(model=config_dirs[ckpt], dtype="float32").dtype is torch.float32
    assert not [m for m in logs if _WHY in m]


def test_engine_args_auto_resolves_float32_without_native_bf16(monkeypatch, config_dirs):
    _fake_cpu(monkeypatch, native_bf16=False)
    mc = EngineArgs(model=config_dirs["bfloat16"], device="cpu").create_engine_config().model_config
    assert mc is not None and mc.dtype is torch.float32


_X86_AVX2 = "fpu vme sse sse2 avx fma f16c avx2 bmi2"
_CASES = [
    (f"processor\t: 0\nflags\t\t: {_X86_AVX2}\n", False),  # AVX2-only EPYC
    (f"flags\t\t: {_X86_AVX2} avx512f avx512bw\n", False),  # AVX-512 without BF16
    (f"flags\t\t: {_X86_AVX2} avx512f avx512_bf16\n", True),  # Zen 4 / Cooper Lake
    (f"flags\t\t: {_X86_AVX2} avx512f amx_tile amx_bf16\n", True),  # Sapphire Rapids
    ("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n", True),  # aarch64 (Graviton 3)
    ("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32\n", False),  # aarch64 without bf16
]


@pytest.mark.parametrize(("cpuinfo", "native"), _CASES)
def test_cpuinfo_flags_decide_native_bf16(monkeypatch, tmp_path, cpuinfo, native):
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    monkeypatch.setattr(cpu_platform, "_CPUINFO", str(path))
    cpu_platform.cpu_has_native_bf16.cache_clear()
    try:
        assert cpu_platform.cpu_has_native_bf16() is native
    finally:
        cpu_platform.cpu_has_native_bf16.cache_clear()


def test_without_cpuinfo_torch_probes_decide(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_platform, "_CPUINFO", str(tmp_path / "absent"))
    for avx512_bf16, amx in ((False, False), (True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        cpu_platform.cpu_has_native_bf16.cache_clear()
        try:
            assert cpu_platform.cpu_has_native_bf16() is (avx512_bf16 or amx)
        finally:
            cpu_platform.cpu_has_native_bf16.cache_clear()
