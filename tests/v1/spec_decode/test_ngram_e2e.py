"""N-gram speculative decoding end to end on the V1 model runner: greedy
outputs are token-identical to the same engine without speculation (chunked
prefill, prefix caching, preemption, logprobs, max_tokens and stop tokens
inside an accepted run, TP=2), and drafts are really proposed and accepted
(the scheduler's SpecDecodingStats, counted over the run)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.spec_decode.metrics import SpecDecodingStats

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
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


def _repetitive(seed: int, n: int) -> list[int]:
    """A prompt that repeats a short random phrase: prompt lookup finds it."""
    rng = random.Random(seed)
    phrase = [rng.randrange(1, 512) for _ in range(rng.randrange(4, 8))]
    return (phrase * (n // len(phrase) + 1))[:n]


def _random(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


PROMPTS = [_repetitive(1, 40), _random(2, 9), _repetitive(3, 70), _random(4, 50)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


class _Stats:
    """Every SpecDecodingStats the scheduler reports (stats logging on)."""

    def __init__(self) -> None:
        self.steps: list[SpecDecodingStats] = []
        self.num_resumed = 0  # requests resumed after a preemption
        self.num_mixed = 0  # steps verifying drafts next to a prefill chunk

    def clear(self) -> None:
        self.steps.clear()
        self.num_resumed = self.num_mixed = 0

    def total(self, name: str) -> int:
        return sum(getattr(s, name) for s in self.steps)


@pytest.fixture(scope="module")
def stats() -> Iterator[_Stats]:
    recorded = _Stats()
    real = Scheduler.update_from_output

    def spy(self, scheduler_output, model_runner_output):
        outputs = real(self, scheduler_output, model_runner_output)
        recorded.num_resumed += len(scheduler_output.scheduled_cached_reqs.resumed_req_ids)
        spec = scheduler_output.scheduled_spec_decode_tokens
        chunk = any(
            n > 1 + len(spec.get(r, ())) for r, n in scheduler_output.num_scheduled_tokens.items()
        )
        recorded.num_mixed += bool(spec) and chunk
        for out in outputs.values():
            sched_stats = out.scheduler_stats
            if sched_stats is not None and sched_stats.spec_decoding_stats is not None:
                recorded.steps.append(sched_stats.spec_decoding_stats)
        return outputs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "update_from_output", spy)
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the spy runs in this process
        yield recorded


@pytest.fixture(scope="module")
def base_llm(tiny_model_dir, stats) -> LLM:
    return LLM(model=tiny_model_dir("llama"), **ENGINE)


@pytest.fixture(scope="module")
def spec_llm(tiny_model_dir, stats) -> LLM:
    llm = LLM(model=tiny_model_dir("llama"), speculative_config=NGRAM, **ENGINE)
    config = llm.llm_engine.vllm_config
    assert not config.use_v2_model_runner and not config.scheduler_config.async_scheduling
    return llm


def _generate(llm: LLM, prompts: list[list[int]], params: SamplingParams):
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    return [o.outputs[0] for o in outs]


def _tokens(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [list(o.token_ids) for o in _generate(llm, prompts, params)]


def test_greedy_identical_and_drafts_accepted(base_llm, spec_llm, stats):
    expected = _tokens(base_llm, PROMPTS, GREEDY)
    stats.clear()
    assert _tokens(spec_llm, PROMPTS, GREEDY) == expected
    drafted, accepted = stats.total("num_draft_tokens"), stats.total("num_accepted_tokens")
    # The repeated phrases are drafted and (the model continues them often
    # enough) accepted; a runner that never proposes would show 0 / 0.
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert accepted <= drafted
    emitted = sum(len(t) for t in expected)
    # Fewer verification steps than tokens: some steps emitted several.
    assert stats.total("num_drafts") < emitted
    assert stats.num_mixed > 0  # drafts verified in steps with prefill chunks


def test_prefix_cache_hit_keeps_outputs(base_llm, spec_llm):
    expected = _tokens(base_llm, PROMPTS[2:], GREEDY)
    # The second round hits the prefix cache filled by the first (drafts'
    # slots are never cached: only real tokens are).
    assert _tokens(spec_llm, PROMPTS[2:], GREEDY) == expected
    assert _tokens(spec_llm, PROMPTS[2:], GREEDY) == expected


def test_logprobs_for_every_emitted_token(base_llm, spec_llm, stats):
    params = SamplingParams(
        temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2, prompt_logprobs=1
    )
    expected = base_llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS[:3]], params)
    stats.clear()
    got = spec_llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS[:3]], params)
    assert stats.total("num_accepted_tokens") > 0
    for want_req, have_req in zip(expected, got):
        # Prompt logprobs (chunked prefill) are the plain engine's.
        assert want_req.prompt_logprobs is not None and have_req.prompt_logprobs is not None
        assert len(have_req.prompt_logprobs) == len(want_req.prompt_logprobs)
        for lp_want, lp_have in zip(want_req.prompt_logprobs[1:], have_req.prompt_logprobs[1:]):
            assert lp_want is not None and lp_have is not None
            assert set(lp_have) == set(lp_want)
            for t in lp_want:
                assert lp_have[t].logprob == pytest.approx(lp_want[t].logprob, abs=1e-4)
        want, have = want_req.outputs[0], have_req.outputs[0]
        assert list(have.token_ids) == list(want.token_ids)
        assert have.logprobs is not None and want.logprobs is not None
        assert len(have.logprobs) == len(have.token_ids)
        for tok, lp_want, lp_have in zip(have.token_ids, want.logprobs, have.logprobs):
            assert tok in lp_have
            assert set(lp_have) == set(lp_want)
            for t in lp_want:
                assert lp_have[t].logprob == pytest.approx(lp_want[t].logprob, abs=1e-4)
                assert lp_have[t].rank == lp_want[t].rank


def test_max_tokens_and_stop_token_inside_an_accepted_run(base_llm, spec_llm):
    full = _tokens(base_llm, [PROMPTS[0]], GREEDY)[0]
    # Every length: most end inside a step that emitted several tokens.
    for max_tokens in (1, 2, 3, 5, 8, 11):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        assert _tokens(spec_llm, [PROMPTS[0]], params)[0] == full[:max_tokens]
    for stop_at in (3, 10):
        stop = full[stop_at]
        params = SamplingParams(
            temperature=0.0, max_tokens=32, ignore_eos=True, stop_token_ids=[stop]
        )
        want = full[: full.index(stop) + 1]
        assert _tokens(spec_llm, [PROMPTS[0]], params)[0] == want
        # The same through a stop string: the text is cut where the run stops.
        text = base_llm.get_tokenizer().decode(want)
        if text:
            params = SamplingParams(
                temperature=0.0, max_tokens=32, ignore_eos=True, stop=[text[-3:]]
            )
            want_text = _generate(base_llm, [PROMPTS[0]], params)[0].text
            assert _generate(spec_llm, [PROMPTS[0]], params)[0].text == want_text


def test_preemption_keeps_outputs(tiny_model_dir, stats):
    """Few KV blocks: requests are preempted and recomputed mid-generation."""
    prompts = [_repetitive(10 + i, 30) for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    small = dict(ENGINE, num_gpu_blocks_override=12)
    base = LLM(model=tiny_model_dir("llama"), **small)
    expected = _tokens(base, prompts, params)
    del base
    llm = LLM(model=tiny_model_dir("llama"), speculative_config=NGRAM, **small)
    stats.clear()
    assert _tokens(llm, prompts, params) == expected
    assert stats.num_resumed > 0  # preemption happened
    assert stats.total("num_accepted_tokens") > 0


def test_tensor_parallel_2(tiny_model_dir, base_llm, stats):
    """TP=2 through the multiprocess executor: drafts reach the scheduler from
    the output rank (`take_draft_token_ids` over collective_rpc)."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    expected = _tokens(base_llm, PROMPTS[:2], params)
    llm = LLM(
        model=tiny_model_dir("llama"),
        speculative_config=NGRAM,
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        **ENGINE,
    )
    stats.clear()
    assert _tokens(llm, PROMPTS[:2], params) == expected
    assert stats.total("num_accepted_tokens") > 0
    llm.llm_engine.engine_core.shutdown()
