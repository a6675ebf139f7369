"""The Triton LoRA kernels (lora_shrink / lora_expand, LoRAKernelMeta) and
PunicaWrapperGPU on CPU tensors under Triton's interpreter, against the dense
float64 reference (checks in triton_checks.py, run in one subprocess)."""

import json
import os
import subprocess
import sys

import pytest

from tests.lora.triton_checks import CHECKS

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.lora.triton_checks"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CHECKS))
def test_triton_lora_kernel(results, name):
    assert results[name] == "ok", results[name]
