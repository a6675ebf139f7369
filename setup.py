"""Build script: the Python package, plus the optional `vllm._C` op library.

Metadata lives in pyproject.toml. This file only adds the compiled ops from
`csrc/` (upstream: CMakeLists.txt drives the build, setup.py calls CMake).
The build is best effort: when there is no CMakeLists.txt, no `cmake`, no C++
compiler, or no importable torch in the build environment, the extension is
skipped and the package runs on its pure-PyTorch paths. A failed compile is
reported and skipped too, so `pip install -e .` always succeeds.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    """An extension whose sources CMake builds (no sources for setuptools)."""

    def __init__(self, name: str, source_dir: Path) -> None:
        super().__init__(name, sources=[], optional=True)
        self.source_dir = str(source_dir)


def _torch_cmake_prefix() -> str | None:
    """torch's CMake prefix: from the build environment, or else from the
    environment being installed into (pip's build isolation hides it, but the
    ops must link against the torch they will run with)."""
    try:
        import torch  # noqa: PLC0415  (only needed when building ops)
        return torch.utils.cmake_prefix_path
    except Exception:
        pass
    # pip runs this file with the target interpreter and hides its
    # site-packages through PYTHONPATH/PYTHONNOUSERSITE; ask it without them.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.utils.cmake_prefix_path)"],
            env=env, capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    prefix = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    return prefix or None


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


class CMakeBuild(build_ext):
    """Runs CMake for each CMakeExtension; never fails the install."""

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        configure = [
            "cmake", ext.source_dir, "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={_torch_cmake_prefix()}",
            f"-DVLLM_PYTHON_EXECUTABLE={sys.executable}",
            f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={out_dir}",
        ]
        jobs = str(max(1, os.cpu_count() or 1))
        try:
            subprocess.run(configure, cwd=build_dir, check=True)
            subprocess.run(["cmake", "--build", ".", "-j", jobs],
                           cwd=build_dir, check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"vllm: skipping the compiled ops ({e}); "
                  "the pure-PyTorch paths will be used.", file=sys.stderr)


def _ext_modules() -> list[Extension]:
    reason = _why_not_buildable()
    if reason is not None:
        print(f"vllm: not building vllm._C ({reason}).", file=sys.stderr)
        return []
    return [CMakeExtension("vllm._C", ROOT)]


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": CMakeBuild})
