"""benchmarks/gpu_real_size.py (issue 22's real-size GPU check): its floors
against hand-worked figures, and the whole script run on CPU with a tiny
config, so that the GPU run does not fail on the script itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
sys.path.insert(0, BENCH)
import gpu_real_size as g  # noqa: E402


def test_llama3_8b_shape_and_floors(tmp_path):
    shape = g.model_shape(g.write_config(str(tmp_path), "llama3-8b"))
    assert shape.params == 8_030_261_248  # Llama-3-8B's published count
    # 32 layers x 8 KV heads x 128 x (K, V)
    assert shape.kv_elems_per_token() == 65536
    # b=1, 1k context: (7.505e9 linear weights + 1024 x 65536 KV) x 2 bytes / 4.8 TB/s
    assert g.decode_floor_ms(shape, 1, 1024) == pytest.approx(
        (7_504_658_432 + 1024 * 65536) * 2 / 4.8e12 * 1e3
    )
    # 2k prompt: 2 x 6.979e9 body MACs per token, the LM head once, causal attention
    attn = 4 * 32 * 32 * 128 * 2048 * 2048 / 2
    expected = 2 * 6_979_321_856 * 2048 + 2 * 4096 * 128256 + attn
    assert g.prefill_flops(shape, 2048) == pytest.approx(expected)
    assert g.prefill_floor_ms(shape, 2048) == pytest.approx(expected / 989e12 * 1e3)


def test_the_script_runs_on_cpu_with_a_tiny_config(tmp_path):
    out = tmp_path / "results.json"
    cmd = [sys.executable, os.path.join(BENCH, "gpu_real_size.py"), "--model", "tiny"]
    cmd += ["--device", "cpu", "--workdir", str(tmp_path), "--batches", "1", "3"]
    cmd += ["--ctx", "24", "--decode-steps", "3", "--prefill", "40"]
    cmd += ["--plan", "v2:eager:CPU_ATTN", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FAILED" not in proc.stdout, proc.stdout
    (result,) = json.loads(out.read_text())
    assert (result["runner"], result["graphs"], result["backend"]) == ("v2", "eager", "CPU_ATTN")
    assert set(result["decode_ms"]) == {"1", "3"} and set(result["prefill_ms"]) == {"40"}
    assert all(ms > 0 for ms in result["prefill_ms"].values())
    assert "decode b=   3 ctx=24" in proc.stdout
