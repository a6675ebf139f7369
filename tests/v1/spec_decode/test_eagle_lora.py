"""EAGLE under LoRA (V1 runner and Model Runner V2): the head drafts with the base model's
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
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

PROMPTS = [[5, 17, 301, 44, 9] * 8, [8, 9, 10, 11, 12]]  # the first in two chunks
ADAPTERS = ["r8-embed-head", "r8"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, dict[str, str], str]:
    root = tmp_path_factory.mktemp("eagle-lora")
    base, paths = build_base_and_adapters(str(root))
    return base, paths, make_tiny_eagle(base, str(root / "eagle"))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_lora_with_eagle_matches_the_merged_model(models, monkeypatch, runner):
    base, paths, head = models
    drafted: list[int] = []
    real = EagleProposer.propose
    real_v2 = EagleSpeculator.propose

    def spy(self, inputs):
        drafts = real(self, inputs)
        drafted.extend(len(d) for d in drafts)
        return drafts

    def spy_v2(self, *args):
        drafts, num_drafts = real_v2(self, *args)
        drafted.extend(num_drafts.tolist())
        return drafts, num_drafts

    monkeypatch.setattr(EagleProposer, "propose", spy)
    monkeypatch.setattr(EagleSpeculator, "propose", spy_v2)
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": 3}
    with lora_llm(
        runner, base, in_process=True, speculative_config=spec, enforce_eager=True
    ) as llm:
        model_runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        drafter = model_runner.drafter if runner == "v1" else model_runner.speculator
        # The base layers under the LoRA wrappers.
        assert type(drafter.model.model.embed_tokens).__name__ == "VocabParallelEmbedding"
        assert type(drafter.model.lm_head).__name__ == "ParallelLMHead"
        loras = [lora_request(name, paths) for name in ADAPTERS]
        got = greedy_tokens(llm, PROMPTS, loras, MAX_TOKENS)
    for prompt, name, tokens in zip(PROMPTS, ADAPTERS, got):
        assert tokens == merged_greedy(base, paths[name], [prompt], MAX_TOKENS)[0], name
    assert sum(drafted) > 0
