"""N-gram speculation under LoRA (V1 runner): each drafting request's draft
rows and bonus row are keyed to its adapter (also the LM head's), in steps
that mix drafts with a prefill chunk too, so greedy outputs equal
transformers' on the peft-merged model, with drafts accepted."""

from __future__ import annotations

import pytest

from tests.lora.lora_engine_utils import (
    build_base_and_adapters,
    greedy_tokens,
    lora_llm,
    lora_request,
    merged_greedy,
)
from tests.v1.spec_decode.test_ngram_e2e import NGRAM, _repetitive
from vllm.v1.core.sched.scheduler import Scheduler

# The long last prompt is prefilled in chunks (16-token budget) while the
# first ones verify drafts: steps where logits rows != tokens.
PROMPTS = [_repetitive(21, 20), [5, 17, 301, 44, 9], _repetitive(22, 108)]
ADAPTERS = ["r8-embed-head", "r8", "r8-embed-head"]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[str, dict[str, str]]:
    return build_base_and_adapters(str(tmp_path_factory.mktemp("lora-spec")))


def test_lora_with_ngram_matches_the_merged_model(models, monkeypatch):
    base, paths = models
    accepted: list[int] = []
    real = Scheduler.update_from_output

    def spy(self, scheduler_output, model_runner_output):
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            index = model_runner_output.req_id_to_index[req_id]
            accepted.append(len(model_runner_output.sampled_token_ids[index]) - 1)
        return real(self, scheduler_output, model_runner_output)

    monkeypatch.setattr(Scheduler, "update_from_output", spy)
    with lora_llm(
        "v1",
        base,
        in_process=True,
        speculative_config=NGRAM,
        enforce_eager=True,
        max_num_batched_tokens=16,
    ) as llm:
        loras = [lora_request(name, paths) for name in ADAPTERS]
        got = greedy_tokens(llm, PROMPTS, loras, MAX_TOKENS)
    for prompt, name, tokens in zip(PROMPTS, ADAPTERS, got):
        assert tokens == merged_greedy(base, paths[name], [prompt], MAX_TOKENS)[0], name
    assert sum(accepted) > 0, accepted  # drafts were verified and some accepted
