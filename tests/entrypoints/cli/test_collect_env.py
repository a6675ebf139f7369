"""`vllm collect-env` (upstream: vllm/collect_env.py): the report's fields,
read from this machine, and no secret-looking environment variable. Run in
this process (`vllm.entrypoints.cli.main.main`): no torch import of its own."""

from __future__ import annotations

import os
import sys

import torch


def test_collect_env_prints_its_fields(monkeypatch, capsys):
    import vllm.envs as envs
    from vllm import _custom_ops as ops
    from vllm.entrypoints.cli.main import main
    from vllm.platforms.cpu_capability import _cpuinfo_flags
    from vllm.version import __version__

    for name, value in {
        "OMP_NUM_THREADS": "2",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "VLLM_SOME_SECRET": "hidden-1",
        "TORCH_API_KEY": "hidden-2",
    }.items():
        monkeypatch.setenv(name, value)
    main(["collect-env"])
    out = capsys.readouterr().out
    fields = {}
    for line in out.splitlines():
        key, sep, value = line.partition(" : ")
        if sep:
            fields[key.strip()] = value.strip()
    assert out.startswith("Collecting environment information...\n")
    assert fields["PyTorch version"] == torch.__version__
    assert fields["vLLM Version"] == __version__
    assert fields["Python version"].startswith(sys.version.split()[0])
    assert fields["CPU count"] == str(os.cpu_count())
    assert fields["Is CUDA available"] == ("Yes" if torch.cuda.is_available() else "No")
    assert fields["Torch CPU capability"] == torch.backends.cpu.get_cpu_capability()
    isa = ops.cpu_ops_isa()
    expected_isa = f"{isa} (VLLM_CPU_ISA={envs.VLLM_CPU_ISA})" if isa else "not loaded"
    assert fields["vLLM CPU ops ISA"].startswith(expected_isa), fields["vLLM CPU ops ISA"]
    flags = _cpuinfo_flags()
    if flags is not None:
        assert ("avx2" in fields["CPU SIMD flags"].split()) == ("avx2" in flags)
    for name in ("OS", "Libc version", "CPU model"):
        assert fields[name] and fields[name] != "Could not collect", name
    assert f"torch=={torch.__version__}" in out
    assert "OMP_NUM_THREADS=2" in out and "VLLM_LOGGING_LEVEL=WARNING" in out
    assert "hidden-1" not in out and "hidden-2" not in out
