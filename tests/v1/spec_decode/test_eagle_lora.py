"""EAGLE under LoRA (V1 runner): the head drafts with the base model's
embedding table and LM head (the LoRA wrappers' base layers), the target
verifies under each request's adapter (embed + LM head adapters too), so
greedy outputs equal transformers' on the peft-merged model."""

from __future__ import annotations

import pytest

from tests.lora.lora_engine_utils import (
    build_base_and_adapters,
    greedy_tokens,
    lora_llm,
    lora_request,
    merged_greedy,
)
from tests.v1.spec_decode.eagle_utils import make_tiny_eagle
from vllm.v1.spec_decode.eagle import EagleProposer

PROMPTS = [[5, 17, 301, 44, 9] * 8, [8, 9, 10, 11, 12]]  # the first in two chunks
ADAPTERS = ["r8-embed-head", "r8"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, dict[str, str], str]:
    root = tmp_path_factory.mktemp("eagle-lora")
    base, paths = build_base_and_adapters(str(root))
    return base, paths, make_tiny_eagle(base, str(root / "eagle"))


def test_lora_with_eagle_matches_the_merged_model(models, monkeypatch):
    base, paths, head = models
    drafted: list[int] = []
    real = EagleProposer.propose

    def spy(self, inputs):
        drafts = real(self, inputs)
        drafted.extend(len(d) for d in drafts)
        return drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": 3}
    with lora_llm("v1", base, in_process=True, speculative_config=spec, enforce_eager=True) as llm:
        drafter = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
        # The base layers under the LoRA wrappers.
        assert type(drafter.model.model.embed_tokens).__name__ == "VocabParallelEmbedding"
        assert type(drafter.model.lm_head).__name__ == "ParallelLMHead"
        loras = [lora_request(name, paths) for name in ADAPTERS]
        got = greedy_tokens(llm, PROMPTS, loras, MAX_TOKENS)
    for prompt, name, tokens in zip(PROMPTS, ADAPTERS, got):
        assert tokens == merged_greedy(base, paths[name], [prompt], MAX_TOKENS)[0], name
    assert sum(drafted) > 0
