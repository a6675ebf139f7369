"""`vllm serve` with a Llama whose forward pass raises on its Nth call
(N = $VLLM_TEST_RAISE_ON_FORWARD): a real fault inside the engine core.

The model is registered out of tree at import time, so the spawned engine
core (which re-imports this file as its main module) has it too.
"""

from __future__ import annotations

import os
from typing import Any

from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.registry import ModelRegistry


class RaisingLlamaForCausalLM(LlamaForCausalLM):
    """Llama that fails its Nth forward pass (and every later one)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.num_calls = getattr(self, "num_calls", 0) + 1
        if self.num_calls >= int(os.environ["VLLM_TEST_RAISE_ON_FORWARD"]):
            raise RuntimeError(f"Simulated forward failure (call {self.num_calls})")
        return super().forward(*args, **kwargs)


ModelRegistry.register_model("LlamaForCausalLM", RaisingLlamaForCausalLM)

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    main()
