"""The examples run as users run them, so they cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_offline_inference_basic(embedded_model_path):
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")  # 1 GiB of KV is plenty here
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/offline_inference/basic.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    prompts = [line for line in lines if line.startswith("Prompt:")]
    outputs = [line for line in lines if line.startswith("Output:")]
    assert len(prompts) == len(outputs) == 4
    capital = prompts.index("Prompt:    'The capital of France is'")
    assert "Paris" in outputs[capital]
