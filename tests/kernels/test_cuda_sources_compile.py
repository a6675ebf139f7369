"""The CUDA sources of vllm._C_cuda compile, here, without a GPU.

Every csrc .cu file (and the CUDA library's torch_bindings.cpp) is compiled
with `nvcc -c` for sm_90 against the build torch's headers, in parallel. A
CPU torch ships the ATen/c10 CUDA headers but not libc10_cuda, so objects are
compiled, never linked. The device code is generated for real (SASS for
sm_90 through ptxas: the object carries a .nv_fatbin section), so a kernel
that does not compile fails here. Warnings in our own files fail too.

A source that passed is remembered under ~/.cache/vllm-tests/cuda-compile
(XDG_CACHE_HOME), keyed by everything its compile depends on: its text and
every csrc header it includes (transitively), the nvcc command, `nvcc
--version`, the torch build and this test file. Only an unchanged source is
skipped, so a change, a fresh machine or VLLM_TEST_NO_COMPILE_CACHE=1 compiles
it again (the full compile costs ~90 s on 2 cores).

Also the CPU-checkable build logic of setup.py: when the CUDA library is
built, and TORCH_CUDA_ARCH_LIST -> CMake CUDA_ARCHITECTURES.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch.utils.cpp_extension

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"


def _setup_module():
    """setup.py's helpers (its setup() call only runs as __main__)."""
    spec = importlib.util.spec_from_file_location("vllm_setup_py", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SETUP = _setup_module()
NVCC = SETUP.find_nvcc()


def _sources() -> list[Path]:
    return sorted([*CSRC.glob("*.cu"), *CSRC.glob("attention/*.cu"), CSRC / "torch_bindings.cpp"])


def _nvcc_command(src: Path, obj: Path) -> list[str]:
    includes = torch.utils.cpp_extension.include_paths()
    cmd = [
        NVCC,
        "-c",
        str(src),
        "-o",
        str(obj),
        "-std=c++17",
        # SASS for sm_90 only (ptxas runs: device code is fully compiled);
        # no PTX copy, no other arches: the cheapest complete check.
        "-gencode=arch=compute_90,code=sm_90",
        # Host side at -O0: these files are mostly torch headers.
        "-Xcompiler=-O0",
        "--expt-relaxed-constexpr",
        # The build's flags (CMakeLists.txt) for torch's C++20 bit-fields.
        "--diag-suppress=3306",
        "-Xcompiler=-Wno-c++20-extensions",
        "-Xcompiler=-Wall",
        "-DTORCH_EXTENSION_NAME=_C_cuda",
        f"-I{sysconfig.get_paths()['include']}",
        *(f"-I{p}" for p in includes),
    ]
    # A CPU torch lacks the generated c10/cuda/impl/cuda_cmake_macros.h; it
    # only sets Windows export macros, which c10 lets a build skip.
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").exists() for p in includes):
        cmd.append("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
    return cmd


def _compile(src: Path, out_dir: Path) -> tuple[Path, subprocess.CompletedProcess]:
    obj = out_dir / (src.relative_to(CSRC).as_posix().replace("/", "_") + ".o")
    proc = subprocess.run(
        _nvcc_command(src, obj), capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    return obj, proc


# ------------------------------------------------- cache of passed sources
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def _local_includes(src: Path) -> list[Path]:
    """`src` and every csrc file it includes with quotes, transitively (the
    torch and CUDA headers are covered by the versions in the key)."""
    seen: dict[Path, None] = {}
    todo = [src.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = None
        for name in _LOCAL_INCLUDE.findall(path.read_text(errors="replace")):
            for base in (path.parent, CSRC):
                candidate = (base / name).resolve()
                if candidate.is_file():
                    todo.append(candidate)
                    break
    return sorted(seen)


def _toolchain_fingerprint() -> str:
    nvcc = subprocess.run([NVCC, "--version"], capture_output=True, text=True, timeout=60)
    return "\n".join(
        [
            nvcc.stdout,
            torch.__version__,
            str(torch.version.git_version),
            *torch.utils.cpp_extension.include_paths(),
            sysconfig.get_paths()["include"],
            Path(__file__).read_text(),
        ]
    )


def _cache_key(src: Path, toolchain: str) -> str:
    h = hashlib.sha256(toolchain.encode())
    # The command with this run's object path left out.
    h.update(" ".join(_nvcc_command(src, Path("OBJ"))).encode())
    for path in _local_includes(src):
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _cache_dir() -> Path | None:
    if os.environ.get("VLLM_TEST_NO_COMPILE_CACHE") == "1":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "vllm-tests" / "cuda-compile"


@pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA_HOME, CUDA_PATH, PATH)")
def test_every_cuda_source_compiles_for_sm90(tmp_path):
    includes = torch.utils.cpp_extension.include_paths()
    if not any((Path(p) / "c10/cuda/CUDAStream.h").exists() for p in includes):
        pytest.skip("this torch ships no c10/cuda headers")
    all_sources = _sources()
    assert len(all_sources) >= 7, all_sources  # 6 .cu files + the bindings
    cache, toolchain = _cache_dir(), _toolchain_fingerprint()
    keys = {src: _cache_key(src, toolchain) for src in all_sources}
    sources = [s for s in all_sources if cache is None or not (cache / keys[s]).exists()]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda s: _compile(s, tmp_path), sources))
    failures = []
    for src, (obj, proc) in zip(sources, results):
        before = len(failures)
        _check_one(src, obj, proc, failures)
        if cache is not None and len(failures) == before:
            cache.mkdir(parents=True, exist_ok=True)
            (cache / keys[src]).write_text(f"{src.relative_to(ROOT)} passed\n")
    assert not failures, "\n\n".join(failures)


def _check_one(src: Path, obj: Path, proc: subprocess.CompletedProcess, failures: list[str]):
    """Appends to `failures` what is wrong with one compile: an error, a
    warning in our sources, a .cu object without device code."""
    rel = src.relative_to(ROOT)
    if proc.returncode != 0:
        failures.append(f"{rel}: nvcc exit {proc.returncode}\n{proc.stderr[-4000:]}")
        return
    own = [
        line for line in proc.stderr.splitlines() if str(CSRC) in line and "warning" in line.lower()
    ]
    if own:
        failures.append(f"{rel}: warnings in our sources:\n" + "\n".join(own))
    if src.suffix == ".cu":
        sections = (
            subprocess.run(["readelf", "-S", str(obj)], capture_output=True, text=True).stdout
            if shutil.which("readelf")
            else ""
        )
        if sections and ".nv_fatbin" not in sections:
            failures.append(f"{rel}: no device code (.nv_fatbin) in the object")


def test_cache_key_covers_every_included_csrc_header():
    """A header edit must invalidate the remembered result of every source
    that includes it, directly or through another header."""
    rel = {
        p.relative_to(CSRC).as_posix()
        for p in _local_includes(CSRC / "attention/paged_attention_v1.cu")
    }
    assert rel == {
        "attention/paged_attention_v1.cu",
        "attention/attention_utils.h",
        "attention/attention_kernels.cuh",
        "cuda_utils.cuh",
        "dispatch_utils.h",
        "ops.h",
    }
    assert {p.name for p in _local_includes(CSRC / "torch_bindings.cpp")} == {
        "torch_bindings.cpp",
        "ops.h",
    }


# ------------------------------------------------------ setup.py build logic
def test_cuda_library_is_built_only_with_nvcc_and_a_cuda_torch(monkeypatch):
    monkeypatch.delenv("VLLM_SKIP_CUDA_BUILD", raising=False)
    assert SETUP.why_no_cuda_build("/usr/bin/nvcc", "12.8") is None
    assert "nvcc" in SETUP.why_no_cuda_build(None, "12.8")
    assert "not a CUDA build" in SETUP.why_no_cuda_build("/usr/bin/nvcc", "")
    assert "not a CUDA build" in SETUP.why_no_cuda_build("/usr/bin/nvcc", None)
    monkeypatch.setenv("VLLM_SKIP_CUDA_BUILD", "1")
    assert SETUP.why_no_cuda_build("/usr/bin/nvcc", "12.8") == "VLLM_SKIP_CUDA_BUILD=1"


def test_torch_cuda_arch_list_to_cmake():
    conv = SETUP.cuda_archs_for_cmake
    assert conv("9.0") == "90-real"
    assert conv("8.0;8.6 9.0+PTX") == "80-real;86-real;90-real;90-virtual"
    assert conv("9.0a,10.0") == "90a-real;100-real"
    assert conv(" 8.9 ; 8.9 ") == "89-real"
    with pytest.raises(ValueError, match="sm_90"):
        conv("sm_90")


def test_default_cuda_archs_follow_nvcc():
    conv = SETUP.cuda_archs_for_cmake
    # An older nvcc without Blackwell: Ampere..Hopper, Hopper also as PTX.
    assert (
        conv(None, {"75", "80", "86", "89", "90"}) == "80-real;86-real;89-real;90-real;90-virtual"
    )
    assert conv("", None).endswith("120-real;120-virtual")
    assert "90-real" in conv(None, None)
    with pytest.raises(ValueError, match="supports none"):
        conv(None, {"70"})
