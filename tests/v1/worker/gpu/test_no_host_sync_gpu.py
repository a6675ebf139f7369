"""Model Runner V2's decode step does not wait for the GPU (issue 22 item 4):
`execute_model` + `sample_tokens` of decode steps run under torch's sync
debug mode "error", which raises on every implicit synchronisation (a
blocking copy to or from the host, `.item()`, `nonzero`, ...). The step's
output is read afterwards, through the async output's own event, as the
engine does. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.v1.worker.gpu.utils import V2ScriptedScheduler
from tests.v1.worker.utils import make_kv_cache_config, make_vllm_config
from vllm.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class _SyncChecked:
    """The runner, with each step run under sync debug mode "error" while
    `checking` is set; an async output is completed outside it."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.checking = False

    def _checked(self, fn, *args):
        if not self.checking:
            return fn(*args)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return fn(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    def execute_model(self, scheduler_output):
        return self._checked(self.runner.execute_model, scheduler_output)

    def sample_tokens(self, grammar_output):
        out = self._checked(self.runner.sample_tokens, grammar_output)
        return out.get_output() if hasattr(out, "get_output") else out


@pytest.mark.parametrize("graphs", ["eager", "FULL_DECODE_ONLY"])
def test_v2_decode_steps_do_not_sync_with_the_host(tmp_path, graphs):
    from tests.utils import make_tiny_model
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    # 32-wide heads: TRITON_ATTN, which has graph support.
    model_dir = make_tiny_model(
        "llama", str(tmp_path), num_attention_heads=2, num_key_value_heads=1
    )
    cc = {"cudagraph_mode": graphs, "max_cudagraph_capture_size": 8}
    config = make_vllm_config(
        model_dir,
        device="cuda",
        async_scheduling=True,
        enforce_eager=graphs == "eager",
        compilation_config=None if graphs == "eager" else cc,
    )
    runner = GPUModelRunner(config, torch.device("cuda"))
    runner.load_model()
    runner.initialize_kv_cache(make_kv_cache_config(runner.get_kv_cache_spec()))
    if graphs != "eager":
        assert runner.capture_model() > 0
    checked = _SyncChecked(runner)
    s = V2ScriptedScheduler(checked)
    greedy = SamplingParams(temperature=0.0, max_tokens=64)
    seeded = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=7, max_tokens=64)
    s.add("a", [5, 9, 3, 7, 11], greedy)
    s.add("b", [4, 4, 19, 6], seeded)
    s.add("c", [13, 2, 2, 17, 30, 7], greedy)
    s.step({"a": 5, "b": 4, "c": 6}, new=("a", "b", "c"))  # prefill: not checked
    s.decode_all(["a", "b", "c"], 2)  # warm-up: Triton compiles here
    checked.checking = True
    s.decode_all(["a", "b", "c"], 6)
    assert all(len(s.reqs[r].outputs) == 9 for r in "abc")
