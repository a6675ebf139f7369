"""Greedy generation with every logits edit, through the engine in both model
runners, against a reference loop over transformers' model and logits
processors (frequency/presence by OpenAI's formula, which transformers
lacks). All edits ride in one batch, each request with its own parameters."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from vllm import SamplingParams
from vllm.inputs import TokensPrompt

EOS = 0
MAX_TOKENS = 8


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 512) for _ in range(n)]


def _reference(hf_model, prompt: list[int], params: SamplingParams, vocab: int) -> list[int]:
    """Greedy decoding with upstream's edits in upstream's order."""
    ids = list(prompt)
    out: list[int] = []
    stop_ids = set(params.stop_token_ids or ()) | ({EOS} if not params.ignore_eos else set())
    while len(out) < (params.max_tokens or MAX_TOKENS):
        with torch.no_grad():
            scores = hf_model(torch.tensor([ids])).logits[:, -1].to(torch.float32)
        all_ids = torch.tensor([ids])
        if params.allowed_token_ids:
            suppress = sorted(set(range(vocab)) - set(params.allowed_token_ids))
            scores = SuppressTokensLogitsProcessor(suppress)(all_ids, scores)
        if params.bad_words_token_ids:  # upstream: the outputs only, not the prompt
            scores = NoBadWordsLogitsProcessor(params.bad_words_token_ids)(
                torch.tensor([out], dtype=torch.long), scores
            )
        if params.min_tokens:
            scores = MinNewTokensLengthLogitsProcessor(
                len(prompt), params.min_tokens, sorted(params.all_stop_token_ids)
            )(all_ids, scores)
        if params.logit_bias:
            scores = SequenceBiasLogitsProcessor([[[t], b] for t, b in params.logit_bias.items()])(
                all_ids, scores
            )
        if params.repetition_penalty != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(all_ids, scores)
        for token, count in Counter(out).items():
            scores[0, token] -= params.frequency_penalty * count + params.presence_penalty
        token = int(scores[0].argmax())
        out.append(token)
        ids.append(token)
        if token in stop_ids and len(out) > params.min_tokens:
            break
    return out


def _cases(tokenizer, plain_first_tokens: list[int]) -> list[tuple[str, dict]]:
    # A bad word that greedy decoding would otherwise produce first.
    word = next(
        tokenizer.decode([t]) for t in plain_first_tokens if tokenizer.decode([t]).strip().isalnum()
    )
    return [
        ("repetition>1", dict(repetition_penalty=1.8)),
        ("repetition<1", dict(repetition_penalty=0.4)),
        (
            "freq+presence+rep",
            dict(frequency_penalty=1.5, presence_penalty=0.9, repetition_penalty=1.3),
        ),
        ("negative freq", dict(frequency_penalty=-2.0, presence_penalty=-0.5)),
        ("logit_bias", dict(logit_bias={5: 0.8, 17: 1.1, 300: -100.0})),
        ("min_tokens+eos", dict(min_tokens=4, logit_bias={EOS: 30.0}, ignore_eos=False)),
        ("min_tokens+stop id", dict(min_tokens=3, stop_token_ids=[77], logit_bias={77: 30.0})),
        ("allowed", dict(allowed_token_ids=[3, 9, 27, 81, 243, 300])),
        ("bad_words", dict(bad_words=[word])),
        (
            "everything",
            dict(
                repetition_penalty=1.2,
                frequency_penalty=0.5,
                logit_bias={9: 0.5},
                allowed_token_ids=list(range(0, 512, 3)),
                bad_words=[word],
                min_tokens=2,
            ),
        ),
    ]


def test_edits_match_the_transformers_reference(runner_llm, hf_model):
    _, llm = runner_llm
    tokenizer = llm.get_tokenizer()
    prompts = [_prompt(s, n) for s, n in ((0, 7), (1, 20))]
    base = dict(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], SamplingParams(**base), use_tqdm=False
    )
    firsts = [t for o in plain for t in o.outputs[0].token_ids]
    cases = _cases(tokenizer, firsts)
    batch_prompts, batch_params, labels = [], [], []
    for label, extra in cases:
        for prompt in prompts:
            batch_prompts.append(TokensPrompt(prompt_token_ids=prompt))
            batch_params.append(SamplingParams(**{**base, **extra}))
            labels.append(label)
    outs = llm.generate(batch_prompts, batch_params, use_tqdm=False)
    vocab = hf_model.config.vocab_size
    changed = set()
    for label, prompt_in, params, out in zip(labels, batch_prompts, batch_params, outs):
        prompt = prompt_in["prompt_token_ids"]
        # The params the engine used: EOS and bad-word ids filled in.
        engine_params = params.clone()
        engine_params.update_from_generation_config({}, EOS)
        engine_params.update_from_tokenizer(tokenizer)
        expected = _reference(hf_model, prompt, engine_params, vocab)
        got = list(out.outputs[0].token_ids)
        assert got == expected, label
        if got != list(plain[prompts.index(prompt)].outputs[0].token_ids):
            changed.add(label)
    # Every edit changed the output of at least one prompt (none is a no-op).
    assert changed == {label for label, _ in cases}


def test_min_tokens_then_stop(runner_llm):
    _, llm = runner_llm
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=_prompt(2, 9))] * 2,
        [
            SamplingParams(temperature=0.0, max_tokens=10, min_tokens=4, logit_bias={EOS: 30.0}),
            SamplingParams(
                temperature=0.0,
                max_tokens=10,
                min_tokens=3,
                stop_token_ids=[77],
                logit_bias={77: 30.0},
            ),
        ],
        use_tqdm=False,
    )
    eos_out, stop_out = outs[0].outputs[0], outs[1].outputs[0]
    assert len(eos_out.token_ids) == 5 and eos_out.token_ids[-1] == EOS
    assert EOS not in eos_out.token_ids[:4]
    assert eos_out.finish_reason == "stop" and eos_out.stop_reason is None
    assert len(stop_out.token_ids) == 4 and stop_out.token_ids[-1] == 77
    assert stop_out.finish_reason == "stop" and stop_out.stop_reason == 77


@pytest.mark.parametrize("kwargs", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_filters_that_leave_one_token_are_greedy(runner_llm, kwargs):
    _, llm = runner_llm
    prompt = TokensPrompt(prompt_token_ids=_prompt(3, 12))
    greedy = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True), use_tqdm=False
    )
    sampled = llm.generate(
        prompt,
        SamplingParams(temperature=1.3, max_tokens=6, ignore_eos=True, **kwargs),
        use_tqdm=False,
    )
    assert sampled[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids
