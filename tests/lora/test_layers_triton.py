"""The LoRA layers driven by PunicaWrapperGPU (the Triton kernels), run by
Triton's interpreter on CPU tensors: the same checks as test_layers.py and
test_layers_vocab.py (dense float64 reference) for a packed, a row, a fully
sharded (3-D shrink / expand buffers), the embedding and the LM-head layer.

Triton reads TRITON_INTERPRET when a kernel is decorated (module import), so
the checks run in a fresh interpreter: `python -m tests.lora.test_layers_triton`
prints one JSON verdict per check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable

import pytest
import torch

from tests.lora import test_layers as linear
from tests.lora import test_layers_vocab as vocab
from tests.lora.lora_ref import TOL

CHECKS: dict[str, Callable[[], None]] = {
    "qkv_merged_fp32_prefill": lambda: linear.test_output_equals_base_plus_dense_reference(
        "qkv", torch.float32, True
    ),
    "qkv_merged_fp32_decode": lambda: linear.test_output_equals_base_plus_dense_reference(
        "qkv", torch.float32, False
    ),
    "gate_up_bf16_decode": lambda: linear.test_output_equals_base_plus_dense_reference(
        "gate_up", torch.bfloat16, False
    ),
    "row_fp32_prefill": lambda: linear.test_output_equals_base_plus_dense_reference(
        "row", torch.float32, True
    ),
    "reset_lora": lambda: linear.test_reset_lora_restores_base("gate_up"),
    "embedding_fp32_decode": lambda: vocab.test_embedding(torch.float32, False),
    "logits_per_token": lambda: vocab.test_logits_one_row_per_token(torch.float32),
    "logits_sampled_rows": lambda: vocab.test_logits_sampled_rows(False),
}


def _check_fully_sharded(name: str) -> None:
    """fully_sharded_loras at TP=1: the sharded classes' shrink -> gather ->
    expand path on the wrapper's [slices, tokens, rank] buffers."""
    case = linear.CASES[name]
    layer, base = linear._wrapped(case, torch.float32, prefill=True, fully_sharded=True)
    assert type(layer) is linear.EXPECTED_SHARDED_CLASS[name]
    x = linear._x(case, torch.float32)
    want = linear._reference(case, x, base(x)[0])
    torch.testing.assert_close(layer(x)[0].double(), want, atol=TOL[torch.float32], rtol=0)


for _name in ("qkv_single", "row"):
    CHECKS[f"fully_sharded_{_name}"] = lambda n=_name: _check_fully_sharded(n)


def _gpu_wrapper():
    from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU

    return PunicaWrapperGPU(64, 16, "cpu", max_loras=linear.MAX_LORAS)


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.lora.test_layers_triton"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(CHECKS))
def test_layer_with_triton_wrapper(results, name):
    assert results[name] == "ok", results[name]


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    linear.WRAPPER_FACTORY[0] = _gpu_wrapper
    verdicts: dict[str, str] = {}
    for name, fn in CHECKS.items():
        try:
            fn()
            verdicts[name] = "ok"
        except Exception:
            verdicts[name] = traceback.format_exc()[-2000:]
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
