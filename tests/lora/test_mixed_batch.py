"""Adapters mixed in one batch (issue 18, "what it must show", second point),
on both model runners, max_loras=2:
- three adapters and the base model in one batch: every request gets its
  solo output (the scheduler holds back the adapter that does not fit a step);
- an adapter loaded (or one in use unloaded) while other requests decode
  changes none of their tokens (upstream's bug: a new adapter landing in an
  active slot);
- the same prompt under two adapters shares no prefix-cache blocks, while the
  same adapter does.
Bad adapters offline: tests/lora/test_mixed_batch_bad_adapters.py."""

from __future__ import annotations

import pytest

from tests.lora.lora_engine_utils import (
    ADAPTERS,
    PROMPTS,
    build_base_and_adapters,
    greedy_params,
    greedy_tokens,
    lora_llm,
    lora_request,
)

NAMES = [a[0] for a in ADAPTERS][:3]  # three adapters, max_loras=2
LONG = 16  # tokens decoded by the requests an adapter load must not disturb


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return build_base_and_adapters(str(tmp_path_factory.mktemp("lora-mixed")))


@pytest.fixture(scope="module", params=["v1", "v2"])
def llm(request, setup):
    base, _ = setup
    with lora_llm(
        request.param,
        base,
        in_process=True,  # one LLMEngine.step() = one engine step
        max_loras=2,
        max_cpu_loras=2,
        enable_prefix_caching=True,
        block_size=16,
    ) as engine:
        yield engine


def _solo(llm, paths, cases, max_tokens):
    """Each (prompt index, adapter name or None) alone in the engine."""
    return [
        greedy_tokens(llm, [PROMPTS[i]], [lora_request(n, paths) if n else None], max_tokens)[0]
        for i, n in cases
    ]


def test_three_adapters_and_base_in_one_batch(llm, setup):
    _, paths = setup
    cases = [(i, n) for i in (0, 2) for n in [*NAMES, None]]
    loras = [lora_request(n, paths) if n else None for _, n in cases]
    mixed = greedy_tokens(llm, [PROMPTS[i] for i, _ in cases], loras)
    assert mixed == _solo(llm, paths, cases, max_tokens=8)
    # The adapters differ from each other and from the base model.
    assert len({tuple(t) for i, t in zip(cases, mixed) if i[0] == 0}) == 4


class Tracker:
    """Steps an LLMEngine, recording each request's tokens and the steps of
    its first token and of its finish."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.step_no = 0
        self.tokens: dict[str, list[int]] = {}
        self.first: dict[str, int] = {}
        self.finished: dict[str, int] = {}

    def run(self, steps: int | None = None) -> None:
        """`steps` engine steps (None: until no request is left)."""
        n = 0
        while self.engine.has_unfinished_requests() and (steps is None or n < steps):
            self.step_no += 1
            n += 1
            for out in self.engine.step():
                tokens = list(out.outputs[0].token_ids)
                if tokens:
                    self.first.setdefault(out.request_id, self.step_no)
                self.tokens[out.request_id] = tokens
                if out.finished:
                    self.finished[out.request_id] = self.step_no


def test_adapter_loaded_mid_decode_changes_no_tokens(llm, setup):
    """r8 and the base model decode; r16 arrives (loaded into the free slot
    while r8 decodes); r8 is unloaded (remove_lora) while "a" still decodes
    with it; r16-rslora is added by LLMEngine.add_lora (max_cpu_loras is 2: the
    CPU cache is full) and then requested while both slots are in use: it
    waits for a slot, and its load disturbs no running request."""
    _, paths = setup
    engine = llm.llm_engine
    for lora_id in sorted(engine.list_loras()):
        assert engine.remove_lora(lora_id)
    assert engine.list_loras() == set()
    plan = {"a": (0, "r8"), "b": (1, None), "c": (2, "r16"), "d": (0, "r16-rslora")}
    tracker = Tracker(engine)

    def add(req_id: str) -> None:
        i, name = plan[req_id]
        lora = lora_request(name, paths) if name else None
        prompt = {"prompt_token_ids": PROMPTS[i]}
        engine.add_request(req_id, prompt, greedy_params(LONG), lora_request=lora)

    add("a")
    add("b")
    tracker.run(steps=3)
    assert 0 < len(tracker.tokens["a"]) < LONG  # "a" is decoding
    add("c")
    tracker.run(steps=3)
    assert tracker.tokens["c"] and len(tracker.tokens["a"]) < LONG  # r16 came in mid-decode
    # Unloading r8 while "a" decodes with it: "a" finishes with its own tokens
    # (the next step loads r8 again from its path).
    assert engine.remove_lora(1)
    tracker.run(steps=1)
    assert len(tracker.tokens["a"]) < LONG
    assert engine.add_lora(lora_request("r16-rslora", paths))
    add("d")
    tracker.run()
    assert set(tracker.finished) == set(plan)
    # r8 and r16 held both slots: r16-rslora started only after one finished.
    assert tracker.first["d"] > min(tracker.finished["a"], tracker.finished["c"])
    solo = _solo(llm, paths, list(plan.values()), max_tokens=LONG)
    assert [tracker.tokens[r] for r in plan] == solo


def test_prefix_cache_not_shared_across_adapters(llm, setup):
    """A 40-token prompt (two full 16-token blocks) seen under r8: under r16
    and the base model no token is a cache hit; under r8 again 32 are."""
    from vllm.inputs import TokensPrompt

    _, paths = setup
    prompt = [(i * 13) % 500 + 3 for i in range(40)]  # used by no other test

    def run(name):
        lora = lora_request(name, paths) if name else None
        (out,) = llm.generate(
            [TokensPrompt(prompt_token_ids=prompt)],
            greedy_params(),
            lora_request=lora,
            use_tqdm=False,
        )
        return out.num_cached_tokens, list(out.outputs[0].token_ids)

    cached_r8, tokens_r8 = run("r8")
    assert cached_r8 == 0
    cached_r16, tokens_r16 = run("r16")
    cached_base, tokens_base = run(None)
    assert (cached_r16, cached_base) == (0, 0)
    assert len({tuple(tokens_r8), tuple(tokens_r16), tuple(tokens_base)}) == 3
    assert run("r8") == (32, tokens_r8)
