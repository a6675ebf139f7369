"""Build script: the Python package, plus the optional compiled op libraries.

Metadata lives in pyproject.toml. This file only adds the compiled ops from
`csrc/` (upstream: CMakeLists.txt drives the build, setup.py calls CMake):

- `vllm._C` (csrc/cpu, `torch.ops._C_cpu`): built when there is a
  CMakeLists.txt, `cmake`, a C++ compiler and an importable torch; on x86
  also `vllm._C_avx2`, `vllm._C_avx512` and `vllm._C_avx512_bf16`, the same
  ops built for those ISAs (CPU_OPS_VARIANTS; vllm/_custom_ops.py loads the
  one the running CPU supports), where the compiler takes their flags.
- `vllm._C_cuda` (csrc/*.cu, csrc/attention, `torch.ops._C` and
  `torch.ops._C_cache_ops`): built only when, in addition, `nvcc` is found
  and that torch is a CUDA build (`torch.version.cuda`). Target GPUs:
  TORCH_CUDA_ARCH_LIST when set, else DEFAULT_CUDA_ARCHS (those this nvcc
  knows), the newest also as PTX.

The build is best effort: a missing prerequisite skips a library, and a
failed compile is reported and skipped too, so `pip install -e .` always
succeeds and the package runs on its pure-PyTorch paths.
"""
from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent

# Ampere, Ada, Hopper, Blackwell (datacenter, consumer).
DEFAULT_CUDA_ARCHS = ("8.0", "8.6", "8.9", "9.0", "10.0", "12.0")


# The CPU ops modules: vllm._C (scalar, every architecture), and on x86 the
# ISA variants CMakeLists.txt builds from the same sources.
X86_CPU_OPS_VARIANTS = ("_C_avx2", "_C_avx512", "_C_avx512_bf16")


def cpu_ops_modules(machine: str) -> tuple[str, ...]:
    """Module names (under vllm) of the CPU ops built for `machine`
    (platform.machine())."""
    x86 = machine.lower() in ("x86_64", "amd64")
    return ("_C",) + (X86_CPU_OPS_VARIANTS if x86 else ())


class CMakeExtension(Extension):
    """An extension whose sources CMake builds (no sources for setuptools):
    the CMake `target`, configured with `cmake_args`. Extensions of one
    `build_group` share a CMake build directory and are built together by
    the first one's `target` (each still optional: one that CMake did not
    produce is left out)."""

    def __init__(self, name: str, source_dir: Path, target: str,
                 cmake_args: tuple[str, ...] = (), build_group: str | None = None) -> None:
        super().__init__(name, sources=[], optional=True)
        self.source_dir = str(source_dir)
        self.target = target
        self.cmake_args = list(cmake_args)
        self.build_group = build_group or name


_TORCH_QUERY = ("import torch; print(torch.utils.cmake_prefix_path); "
                "print(torch.version.cuda or '')")


@functools.lru_cache(maxsize=None)
def _build_torch() -> tuple[str, str] | None:
    """(CMake prefix, CUDA version or '') of torch: from the build environment,
    or else from the environment being installed into (pip's build isolation
    hides it, but the ops must link against the torch they will run with)."""
    try:
        import torch  # noqa: PLC0415  (only needed when building ops)
        return torch.utils.cmake_prefix_path, torch.version.cuda or ""
    except Exception:
        pass
    # pip runs this file with the target interpreter and hides its
    # site-packages through PYTHONPATH/PYTHONNOUSERSITE; ask it without them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_QUERY], env=env,
                             capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    if len(lines) < 2 or not lines[-2].strip():
        return None
    return lines[-2].strip(), lines[-1].strip()


def _torch_cmake_prefix() -> str | None:
    info = _build_torch()
    return info[0] if info else None


def _why_not_buildable() -> str | None:
    if os.environ.get("VLLM_SKIP_CSRC_BUILD") == "1":
        return "VLLM_SKIP_CSRC_BUILD=1"
    if not (ROOT / "CMakeLists.txt").exists():
        return "no CMakeLists.txt"
    if shutil.which("cmake") is None:
        return "cmake not found"
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        return "no C++ compiler"
    if _torch_cmake_prefix() is None:
        return "torch not importable in the build environment"
    return None


def find_nvcc() -> str | None:
    """nvcc from CUDA_HOME / CUDA_PATH, else from PATH."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def why_no_cuda_build(nvcc: str | None, torch_cuda: str | None) -> str | None:
    """Why vllm._C_cuda is not built (None: build it). `torch_cuda` is the
    build torch's `torch.version.cuda` ('' or None for a CPU build)."""
    if os.environ.get("VLLM_SKIP_CUDA_BUILD") == "1":
        return "VLLM_SKIP_CUDA_BUILD=1"
    if nvcc is None:
        return "nvcc not found"
    if not torch_cuda:
        return "the build environment's torch is not a CUDA build"
    return None


_ARCH_RE = re.compile(r"^(\d+)\.(\d)([af]?)(\+PTX)?$")


def cuda_archs_for_cmake(arch_list: str | None, nvcc_archs: set[str] | None = None) -> str:
    """TORCH_CUDA_ARCH_LIST syntax ("8.0;9.0+PTX", "8.6 9.0a", commas too) ->
    CMake CUDA_ARCHITECTURES ("80-real;90-real;90-virtual"): each entry
    builds SASS for that GPU, "+PTX" adds PTX for newer ones. None/empty:
    DEFAULT_CUDA_ARCHS, kept to those in `nvcc_archs` (e.g. {"90", "100"},
    from `nvcc --list-gpu-arch`; None keeps all), the newest with PTX."""
    if not arch_list or not arch_list.strip():
        archs = [a for a in DEFAULT_CUDA_ARCHS
                 if nvcc_archs is None or a.replace(".", "") in nvcc_archs]
        if not archs:
            raise ValueError(f"nvcc supports none of {DEFAULT_CUDA_ARCHS}")
        arch_list = ";".join(archs[:-1] + [archs[-1] + "+PTX"])
    out: list[str] = []
    for entry in re.split(r"[;,\s]+", arch_list.strip()):
        m = _ARCH_RE.match(entry)
        if m is None:
            raise ValueError(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not like "
                             "'9.0', '9.0a' or '9.0+PTX'")
        code = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        for item in (f"{code}-real",) + ((f"{code}-virtual",) if m.group(4) else ()):
            if item not in out:
                out.append(item)
    return ";".join(out)


def _nvcc_archs(nvcc: str) -> set[str] | None:
    """Compute capabilities this nvcc compiles for ("90", "100", ...)."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return set(re.findall(r"compute_(\d+)", out)) or None


def _cuda_extension() -> Extension | None:
    nvcc = find_nvcc()
    info = _build_torch()
    reason = why_no_cuda_build(nvcc, info[1] if info else None)
    if reason is None:
        try:
            archs = cuda_archs_for_cmake(os.environ.get("TORCH_CUDA_ARCH_LIST"),
                                         _nvcc_archs(nvcc))
        except ValueError as e:
            reason = str(e)
    if reason is not None:
        print(f"vllm: not building vllm._C_cuda ({reason}).", file=sys.stderr)
        return None
    print(f"vllm: building vllm._C_cuda for CUDA architectures {archs}.", file=sys.stderr)
    return CMakeExtension("vllm._C_cuda", ROOT, "_C_cuda", (
        "-DVLLM_BUILD_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}",
        f"-DVLLM_CUDA_ARCHS={archs}"))


def _keep_going_args() -> list[str]:
    """Native build-tool flag to build every target it can past a failure
    (an ISA variant the compiler chokes on must not take the others)."""
    if "ninja" in os.environ.get("CMAKE_GENERATOR", "").lower():
        return ["--", "-k", "0"]
    return ["--", "-k"]


class CMakeBuild(build_ext):
    """Runs CMake for each build group of CMakeExtensions (one build
    directory each, so a failing CUDA configure cannot take the CPU ops with
    it); never fails the install."""

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        built: set[str] = self.__dict__.setdefault("_vllm_built_groups", set())
        if ext.build_group in built:
            return
        built.add(ext.build_group)
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / ext.build_group
        build_dir.mkdir(parents=True, exist_ok=True)
        group = [e for e in self.extensions
                 if isinstance(e, CMakeExtension) and e.build_group == ext.build_group]
        # A module left from an earlier build must not pass for this one's.
        for member in group:
            Path(self.get_ext_fullpath(member.name)).unlink(missing_ok=True)
        configure = [
            "cmake", ext.source_dir, "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={_torch_cmake_prefix()}",
            f"-DVLLM_PYTHON_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
            *ext.cmake_args,
        ]
        jobs = str(max(1, os.cpu_count() or 1))
        try:
            subprocess.run(configure, cwd=build_dir, check=True)
            subprocess.run(["cmake", "--build", ".", "--target", ext.target, "-j", jobs,
                            *(_keep_going_args() if len(group) > 1 else [])],
                           cwd=build_dir, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"vllm: {ext.target} failed ({e}); what it built is kept, the "
                  "pure-PyTorch paths stand in for the rest.", file=sys.stderr)
        missing = [m.name for m in group if not Path(self.get_ext_fullpath(m.name)).exists()]
        if missing:
            print(f"vllm: not built: {', '.join(missing)}.", file=sys.stderr)


def _ext_modules() -> list[Extension]:
    reason = _why_not_buildable()
    if reason is not None:
        print(f"vllm: not building vllm._C ({reason}).", file=sys.stderr)
        return []
    exts: list[Extension] = [
        CMakeExtension(f"vllm.{name}", ROOT, "_C_cpu_all", build_group="vllm._C")
        for name in cpu_ops_modules(platform.machine())
    ]
    cuda = _cuda_extension()
    if cuda is not None:
        exts.append(cuda)
    return exts


# Guarded so tests can import the helpers above; setuptools' build backend
# and `python setup.py ...` both run this file as __main__.
if __name__ == "__main__":
    setup(ext_modules=_ext_modules(), cmdclass={"build_ext": CMakeBuild})
