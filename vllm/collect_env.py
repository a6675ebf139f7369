"""`vllm collect-env` (upstream: vllm/collect_env.py): the environment report
to paste into a bug report. Everything is read locally (no network):

* system: OS, libc, compilers (gcc, clang, cmake when on PATH);
* PyTorch and Python: versions, debug build, the CUDA / ROCm torch was built
  with, whether a GPU is usable and which;
* CPU: model, cores, torch's CPU capability, the SIMD flags the CPU ops
  variants need (/proc/cpuinfo) and the variant vllm loaded
  (`vllm._custom_ops.cpu_ops_isa()`, or why none was);
* versions of the libraries vllm depends on (package metadata, not pip);
* vllm: version and the CPU op modules this build has;
* environment variables: vllm's own (vllm/envs.py) and the torch / CUDA /
  NCCL / OpenMP / MKL families, leaving out any whose name suggests a secret
  (as upstream: secret, token, api, access, password).

Fields that cannot be read print "Could not collect", as upstream's.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from vllm.envs import environment_variables

NOT_COLLECTED = "Could not collect"

# Packages whose versions matter to a vllm bug report.
RELEVANT_PACKAGES = (
    "torch",
    "numpy",
    "transformers",
    "tokenizers",
    "safetensors",
    "sentencepiece",
    "gguf",
    "triton",
    "xgrammar",
    "msgspec",
    "pyzmq",
    "fastapi",
    "uvicorn",
    "pydantic",
    "openai",
    "prometheus_client",
    "ray",
)

# The SIMD features the CPU ops variants are built for (cpu_capability.py).
CPU_FLAGS_OF_INTEREST = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_bf16",
    "amx_bf16",
)

_SECRET_TERMS = ("secret", "token", "api", "access", "password")
_REPORTED_PREFIXES = ("TORCH", "PYTORCH", "CUDA", "NCCL", "CUBLAS", "CUDNN", "OMP_", "MKL_", "KMP_")


@dataclasses.dataclass(frozen=True)
class SystemEnv:
    """What the report shows; None means it could not be read."""

    os: str | None
    libc_version: str | None
    gcc_version: str | None
    clang_version: str | None
    cmake_version: str | None
    torch_version: str | None
    is_debug_build: bool | None
    cuda_compiled_version: str | None
    hip_compiled_version: str | None
    python_version: str
    python_platform: str
    is_cuda_available: bool | None
    gpu_models: str | None
    cpu_model: str | None
    cpu_count: int | None
    torch_cpu_capability: str | None
    cpu_flags: str | None
    cpu_ops_isa: str | None
    packages: str
    vllm_version: str
    vllm_build_flags: str
    env_vars: str


def _run_first_line(cmd: list[str]) -> str | None:
    """The first output line of a local tool, None when it is absent or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def get_os() -> str | None:
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    name = line.partition("=")[2].strip().strip('"')
                    return f"{name} ({platform.machine()})"
    except OSError:
        pass
    return platform.platform() or None


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty elsewhere)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def get_cpu_flags(cpuinfo: dict[str, str]) -> str | None:
    flags = set((cpuinfo.get("flags") or cpuinfo.get("Features") or "").split())
    if not flags:
        return None
    have = [f for f in CPU_FLAGS_OF_INTEREST if f in flags]
    return " ".join(have) or "none of " + " ".join(CPU_FLAGS_OF_INTEREST)


def get_cpu_ops_isa() -> str:
    """The CPU ops variant vllm loaded (and VLLM_CPU_ISA), or why none was."""
    try:
        from vllm import _custom_ops as ops
    except Exception as e:  # a broken build must not stop the report
        return f"not loaded ({type(e).__name__}: {e})"
    requested = environment_variables["VLLM_CPU_ISA"]()
    isa = ops.cpu_ops_isa()
    if isa is None:
        return f"not loaded ({ops.cpu_ops_load_error()}); VLLM_CPU_ISA={requested}"
    return f"{isa} (VLLM_CPU_ISA={requested})"


def get_packages() -> str:
    lines = []
    for name in RELEVANT_PACKAGES:
        try:
            lines.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return "\n".join(lines) or "No relevant packages"


def get_vllm_build_flags() -> str:
    """Which compiled op modules this build has (vllm/_C*.so)."""
    modules = ["_C", "_C_avx2", "_C_avx512", "_C_avx512_bf16", "_C_cuda"]
    built = [m for m in modules if importlib.util.find_spec(f"vllm.{m}") is not None]
    return "CPU/CUDA op modules: " + (", ".join(built) if built else "none")


def get_env_vars() -> str:
    lines = []
    for key, value in sorted(os.environ.items()):
        if any(term in key.lower() for term in _SECRET_TERMS):
            continue
        if key in environment_variables or key.startswith(("VLLM_", *_REPORTED_PREFIXES)):
            lines.append(f"{key}={value}")
    return "\n".join(lines)


_TORCH_FIELDS = (
    "torch_version",
    "is_debug_build",
    "cuda_compiled_version",
    "hip_compiled_version",
    "is_cuda_available",
    "gpu_models",
    "torch_cpu_capability",
)


def _torch_info() -> dict[str, Any]:
    """SystemEnv's torch fields (all None without torch)."""
    try:
        import torch
    except ImportError:
        return dict.fromkeys(_TORCH_FIELDS)
    cuda = torch.cuda.is_available()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    return dict(
        torch_version=torch.__version__,
        is_debug_build=torch.version.debug,
        cuda_compiled_version=torch.version.cuda,
        hip_compiled_version=getattr(torch.version, "hip", None),
        is_cuda_available=cuda,
        gpu_models=", ".join(gpus) or None,
        torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
    )


def get_env_info() -> SystemEnv:
    from vllm.version import __version__

    libc = " ".join(platform.libc_ver()).strip()
    cpuinfo = _cpuinfo()
    return SystemEnv(
        **_torch_info(),
        os=get_os(),
        libc_version=libc or None,
        gcc_version=_run_first_line(["gcc", "--version"]),
        clang_version=_run_first_line(["clang", "--version"]),
        cmake_version=_run_first_line(["cmake", "--version"]),
        python_version=f"{sys.version.split()[0]} ({sys.maxsize.bit_length() + 1}-bit runtime)",
        python_platform=platform.platform(),
        cpu_model=cpuinfo.get("model name") or platform.processor() or None,
        cpu_count=os.cpu_count(),
        cpu_flags=get_cpu_flags(cpuinfo),
        cpu_ops_isa=get_cpu_ops_isa(),
        packages=get_packages(),
        vllm_version=__version__,
        vllm_build_flags=get_vllm_build_flags(),
        env_vars=get_env_vars(),
    )


def _section(title: str) -> str:
    bar = "=" * 30
    return f"{bar}\n{title.center(30).rstrip()}\n{bar}"


def _value(v: object) -> str:
    if v is None:
        return NOT_COLLECTED
    if isinstance(v, bool):
        return "Yes" if v else "No"
    return str(v)


def pretty_str(env: SystemEnv) -> str:
    def rows(*pairs: tuple[str, object]) -> str:
        return "\n".join(f"{label:<29}: {_value(v)}" for label, v in pairs)

    parts = [
        _section("System Info"),
        rows(
            ("OS", env.os),
            ("GCC version", env.gcc_version),
            ("Clang version", env.clang_version),
            ("CMake version", env.cmake_version),
            ("Libc version", env.libc_version),
        ),
        "",
        _section("PyTorch Info"),
        rows(
            ("PyTorch version", env.torch_version),
            ("Is debug build", env.is_debug_build),
            ("CUDA used to build PyTorch", env.cuda_compiled_version),
            ("ROCM used to build PyTorch", env.hip_compiled_version),
        ),
        "",
        _section("Python Environment"),
        rows(("Python version", env.python_version), ("Python platform", env.python_platform)),
        "",
        _section("GPU Info"),
        rows(("Is CUDA available", env.is_cuda_available), ("GPU models", env.gpu_models)),
        "",
        _section("CPU Info"),
        rows(
            ("CPU model", env.cpu_model),
            ("CPU count", env.cpu_count),
            ("Torch CPU capability", env.torch_cpu_capability),
            ("CPU SIMD flags", env.cpu_flags),
            ("vLLM CPU ops ISA", env.cpu_ops_isa),
        ),
        "",
        _section("Versions of relevant libraries"),
        env.packages,
        "",
        _section("vLLM Info"),
        rows(("vLLM Version", env.vllm_version)),
        f"vLLM Build Flags:\n  {env.vllm_build_flags}",
        "",
        _section("Environment Variables"),
        env.env_vars,
    ]
    return "\n".join(parts).rstrip() + "\n"


def get_pretty_env_info() -> str:
    return pretty_str(get_env_info())


def main() -> None:
    print("Collecting environment information...")
    print(get_pretty_env_info())


if __name__ == "__main__":
    main()
