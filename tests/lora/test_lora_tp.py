"""LoRA under tensor parallelism (issue 18, "what it must show", first point,
TP=2): two workers (multiprocess executor), each holding its shard of every
adapter (column-parallel layers: B split on the output dim; row-parallel
layers: A split on the input dim, before the all-reduce), generate exactly
the greedy tokens of transformers' PeftModel.merge_and_unload() in float32,
for every adapter and the base model mixed in one call; a bad adapter is
refused with the workers' typed error and the engine serves on."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.lora.lora_engine_utils import (
    ADAPTERS,
    MAX_TOKENS,
    PROMPTS,
    build_base_and_adapters,
    greedy_tokens,
    lora_llm,
    lora_request,
    merged_greedy,
)
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

NAMES = [a[0] for a in ADAPTERS]


def _copy_config(src: str, dst: str, **changes) -> str:
    """A copy of adapter `src` with its adapter_config.json changed."""
    shutil.copytree(src, dst)
    path = f"{dst}/adapter_config.json"
    with open(path) as f:
        config = json.load(f)
    with open(path, "w") as f:
        json.dump({**config, **changes}, f)
    return dst


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base, paths = build_base_and_adapters(str(tmp_path_factory.mktemp("lora-tp")))
    expected = {
        name: merged_greedy(base, paths[name] if name else None, PROMPTS, MAX_TOKENS)
        for name in [*NAMES, None]
    }
    return base, paths, expected


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_tp2_adapters_match_merged_peft(setup, runner, tmp_path):
    base, paths, expected = setup
    cases = [(i, name) for name in [*NAMES, None] for i in range(len(PROMPTS))]
    with lora_llm(runner, base, tensor_parallel_size=2, max_loras=2) as llm:
        assert llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
        loras = [lora_request(n, paths) if n is not None else None for _, n in cases]
        got = greedy_tokens(llm, [PROMPTS[i] for i, _ in cases], loras)
        assert got == [expected[n][i] for i, n in cases]
        # Bad adapters: each worker's typed error reaches the caller (through
        # the multiprocess executor), nothing is loaded, the engine serves on.
        loaded = llm.llm_engine.list_loras()
        missing = LoRARequest("missing", 90, str(tmp_path / "nowhere"))
        with pytest.raises(LoRAAdapterNotFoundError, match="No adapter found for"):
            greedy_tokens(llm, PROMPTS[:1], [missing])
        rank32 = LoRARequest("rank32", 91, _copy_config(paths["r8"], str(tmp_path / "r32"), r=32))
        with pytest.raises(ValueError, match="LoRA rank 32 is greater than max_lora_rank 16"):
            greedy_tokens(llm, PROMPTS[:1], [rank32])
        assert llm.llm_engine.list_loras() == loaded
        r16 = lora_request("r16", paths)
        assert greedy_tokens(llm, PROMPTS[:1], [r16]) == [expected["r16"][0]]
