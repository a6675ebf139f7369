"""The Triton attention backend over padded batches, end to end on CPU: the
V1 and V2 runners with TRITON_ATTN under the Triton interpreter, graph keys
forced (the model runs eagerly on the padded inputs, as a replay would).
Greedy tokens must equal transformers' `generate`. This runs the GPU path's
metadata (persistent buffers, dummy requests) and kernels (sync-free cache
write, unified attention) without a GPU. One subprocess: the interpreter
must be chosen before triton is imported."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from tests.utils import hf_greedy

_SCRIPT = r"""
import json, sys
import torch
from vllm.platforms.cpu import CpuPlatform

from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

CpuPlatform.get_attn_backend_cls = classmethod(
    lambda cls, *a, **k: "vllm.v1.attention.backends.triton_attn.TritonAttentionBackend")
# The tiny test model's heads are 16 wide; the kernel pads heads to >= 16.
TritonAttentionBackend.get_supported_head_sizes = classmethod(lambda cls: [])

from tests.v1.cudagraph.test_padding_cpu import SIZES, GREEDY
from tests.v1.worker.utils import ScriptedScheduler, make_kv_cache_config, make_vllm_config
from tests.v1.worker.gpu.utils import V2ScriptedScheduler, make_v2_runner
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu_worker import Worker

model_dir, prompts = sys.argv[1], json.loads(sys.argv[2])
mode = CUDAGraphMode.FULL


def script(s):
    for req_id, prompt in zip("abc", prompts):
        s.add(req_id, prompt, GREEDY)
    s.step({"a": 6, "b": 5}, new=("a", "b"))
    s.step({"a": 5, "b": 1, "c": 7}, new=("c",))
    while min(len(s.reqs[r].outputs) for r in "abc") < 4:
        s.step({r: 1 for r in "abc" if len(s.reqs[r].outputs) < 4})
    return [s.reqs[r].outputs for r in "abc"]


import os
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
worker = Worker(make_vllm_config(model_dir))
worker.init_device()
worker.load_model()
worker.initialize_from_config(make_kv_cache_config(worker.get_kv_cache_spec()))
runner = worker.model_runner
assert type(runner.attn_groups[0][0].metadata_builder).__name__ == "TritonAttentionMetadataBuilder"
runner.vllm_config.compilation_config.cudagraph_capture_sizes = list(SIZES)
runner.cudagraph_manager.initialize(mode)
v1 = script(ScriptedScheduler(worker))
worker.shutdown()

runner = make_v2_runner(model_dir, max_num_seqs=8, max_num_batched_tokens=64)
runner.vllm_config.compilation_config.cudagraph_capture_sizes = list(SIZES)
runner.cudagraph_manager.initialize(mode)
v2 = script(V2ScriptedScheduler(runner))
print("RESULT " + json.dumps({"v1": v1, "v2": v2}))
"""


def test_triton_backend_padded_batches_match_transformers(tiny_model_dir):
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        # The script swaps the CPU platform's backend choice; on a GPU the
        # CUDA platform picks, and test_cudagraph_gpu.py covers this path.
        pytest.skip("CPU-only (interpreter) test; a GPU is present")
    model_dir = tiny_model_dir("llama")
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 512) for _ in range(n)] for n in (11, 5, 7)]
    expected = hf_greedy(model_dir, prompts, 4)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, model_dir, json.dumps(prompts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        ),
    )
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    result = json.loads(line[0][7:])
    assert result["v1"] == expected
    assert result["v2"] == expected
