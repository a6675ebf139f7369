"""Suffix decoding end to end on the V1 model runner (arctic-inference's
suffix trees): greedy outputs are token-identical to the same engine without
speculation (chunked prefill, prefix caching, preemption), drafts are
proposed and accepted (the scheduler's SpecDecodingStats), a request repeating
an earlier one's output is drafted from the global response cache (and not
with the cache off), and the start-up rules are upstream's (V1 runner, async
scheduling refused or turned off)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is not installed")

# The prompts of the ngram test (repeated phrases and random ids).
from tests.v1.spec_decode.test_ngram_e2e import PROMPTS, _random, _repetitive  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.spec_decode.metrics import SpecDecodingStats  # noqa: E402

SUFFIX = {"method": "suffix", "num_speculative_tokens": 6}
# Small token budget and blocks: the longer prompts are prefilled in chunks.
ENGINE = dict(
    dtype="float32",
    enforce_eager=True,
    max_model_len=256,
    max_num_batched_tokens=32,
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
    block_size=16,
    seed=0,
    disable_log_stats=False,
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def stats() -> Iterator[list[SpecDecodingStats]]:
    """Every SpecDecodingStats the scheduler reports (stats logging on)."""
    recorded: list[SpecDecodingStats] = []
    real = Scheduler.update_from_output

    def spy(self, scheduler_output, model_runner_output):
        outputs = real(self, scheduler_output, model_runner_output)
        for out in outputs.values():
            sched_stats = out.scheduler_stats
            if sched_stats is not None and sched_stats.spec_decoding_stats is not None:
                recorded.append(sched_stats.spec_decoding_stats)
        return outputs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "update_from_output", spy)
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the spy runs in this process
        yield recorded


def _total(stats: list[SpecDecodingStats], name: str) -> int:
    return sum(getattr(s, name) for s in stats)


@pytest.fixture(scope="module")
def base_llm(tiny_model_dir, stats) -> LLM:
    return LLM(model=tiny_model_dir("llama"), **ENGINE)


@pytest.fixture(scope="module")
def suffix_llm(tiny_model_dir, stats) -> LLM:
    llm = LLM(model=tiny_model_dir("llama"), speculative_config=SUFFIX, **ENGINE)
    config = llm.llm_engine.vllm_config
    assert not config.use_v2_model_runner and not config.scheduler_config.async_scheduling
    return llm


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_greedy_identical_and_drafts_accepted(base_llm, suffix_llm, stats):
    expected = _tokens(base_llm, PROMPTS, GREEDY)
    stats.clear()
    assert _tokens(suffix_llm, PROMPTS, GREEDY) == expected
    drafted, accepted = _total(stats, "num_draft_tokens"), _total(stats, "num_accepted_tokens")
    # A runner that never proposed would show 0 / 0.
    assert 0 < accepted <= drafted, (drafted, accepted)
    # Fewer verification steps than tokens: some steps emitted several.
    assert _total(stats, "num_drafts") < sum(len(t) for t in expected)


def _accepted_per_round(llm: LLM, prompt: list[int], stats: list[SpecDecodingStats]):
    """Accepted drafts of two runs of the same new prompt, one after the other."""
    out = []
    for _ in range(2):
        stats.clear()
        tokens = _tokens(llm, [prompt], GREEDY)[0]
        out.append(_total(stats, "num_accepted_tokens"))
    return out, tokens


def test_second_request_drafts_from_the_global_cache(tiny_model_dir, base_llm, suffix_llm, stats):
    prompt = _random(7, 24)
    expected = _tokens(base_llm, [prompt], GREEDY)[0]
    (first, second), tokens = _accepted_per_round(suffix_llm, prompt, stats)
    assert tokens == expected
    # The second run's output is the first's, cached in the global tree:
    # most of it is drafted and accepted (the first run only had its own
    # prompt and output so far to match).
    assert second > first and second >= len(expected) // 2, (first, second)
    # With the global cache off, the second run has nothing more to go on
    # (the first run above could also draw on the earlier tests' responses).
    no_cache = {**SUFFIX, "suffix_decoding_max_cached_requests": 0}
    llm = LLM(model=tiny_model_dir("llama"), speculative_config=no_cache, **ENGINE)
    (first_nc, second_nc), tokens = _accepted_per_round(llm, prompt, stats)
    assert tokens == expected
    assert first_nc == second_nc < second, (first_nc, second_nc, second)


def test_preemption_keeps_outputs(tiny_model_dir, stats):
    """Few KV blocks: requests are preempted and recomputed mid-generation
    (they leave the batch, their trees stop, and start again on return)."""
    prompts = [_repetitive(10 + i, 30) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    small = dict(ENGINE, num_gpu_blocks_override=12)
    base = LLM(model=tiny_model_dir("llama"), **small)
    expected = _tokens(base, prompts, params)
    del base
    llm = LLM(model=tiny_model_dir("llama"), speculative_config=SUFFIX, **small)
    stats.clear()
    assert _tokens(llm, prompts, params) == expected
    assert _total(stats, "num_accepted_tokens") > 0


def _config(model: str, **kwargs):
    return EngineArgs(model=model, device="cpu", **kwargs).create_engine_config()


def test_start_up_rules(tiny_model_dir, monkeypatch):
    model = tiny_model_dir("llama")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    mp = {"distributed_executor_backend": "mp"}  # async would default on
    config = _config(model, speculative_config=SUFFIX, **mp)
    assert config.scheduler_config.async_scheduling is False
    assert not config.use_v2_model_runner
    assert config.speculative_config is not None
    assert config.speculative_config.suffix_decoding_max_tree_depth == 24
    with pytest.raises(ValueError, match="async scheduling is only supported with EAGLE"):
        _config(model, speculative_config=SUFFIX, async_scheduling=True)
