"""LLM.beam_search against transformers' beam search (upstream:
tests/samplers/test_beam_search.py).

Upstream's beam search and transformers' agree exactly when no beam ends
early: both keep, at every step, the beam_width best (beam, token) pairs by
cumulative logprob, and rank the final, equally long beams by
cumulative logprob / length ** length_penalty. They differ once EOS is in
play (upstream finishes every EOS candidate among a beam's top 2 * width and
counts the prompt in the length; transformers only finishes EOS candidates
ranked in the global top width and counts generated tokens), so the
comparison runs with EOS ignored (`ignore_eos=True` / `eos_token_id=None`),
and `early_stopping="never"`, the transformers mode closest to upstream's
"run max_tokens steps" loop.
"""

from __future__ import annotations

import math

import pytest
import torch

from vllm.beam_search import get_beam_search_score
from vllm.sampling_params import BeamSearchParams

PROMPTS = ["The quick brown", "def hello(world):", "Paged attention stores"]
BEAM_WIDTH = 4
MAX_TOKENS = 6


@pytest.mark.parametrize("length_penalty", [1.0, 0.5])
def test_beam_search_matches_transformers(runner_llm, hf_model, length_penalty):
    _, llm = runner_llm
    tokenizer = llm.get_tokenizer()
    outs = llm.beam_search(
        [{"prompt": p} for p in PROMPTS],
        BeamSearchParams(
            beam_width=BEAM_WIDTH,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            length_penalty=length_penalty,
        ),
    )
    for prompt, out in zip(PROMPTS, outs):
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]),
                num_beams=BEAM_WIDTH,
                num_return_sequences=BEAM_WIDTH,
                max_new_tokens=MAX_TOKENS,
                min_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                length_penalty=length_penalty,
                early_stopping="never",
                output_scores=True,
                return_dict_in_generate=True,
            )
        assert [s.tokens for s in out.sequences] == ref.sequences.tolist()
        # transformers' score divides by the generated length only; with equal
        # lengths the ranking is the same, and the sums of logprobs agree.
        for seq, score in zip(out.sequences, ref.sequences_scores.tolist()):
            assert math.isclose(seq.cum_logprob, score * MAX_TOKENS**length_penalty, abs_tol=1e-4)
            assert seq.text == tokenizer.decode(seq.tokens)
            assert len(seq.logprobs) == MAX_TOKENS


def test_beam_search_with_eos_keeps_upstream_invariants(runner_llm):
    _, llm = runner_llm
    tokenizer = llm.get_tokenizer()
    eos = tokenizer.eos_token_id
    params = BeamSearchParams(beam_width=3, max_tokens=5, length_penalty=1.0)
    (out,) = llm.beam_search([{"prompt_token_ids": [7, 8, 9, 10]}], params)
    scores = [get_beam_search_score(s.tokens, s.cum_logprob, eos, 1.0) for s in out.sequences]
    assert len(out.sequences) == 3 and scores == sorted(scores, reverse=True)
    for seq in out.sequences:
        generated = seq.tokens[4:]
        assert seq.tokens[:4] == [7, 8, 9, 10]
        # Finished at EOS, or ran the full max_tokens without one.
        assert (generated[-1] == eos and eos not in generated[:-1]) or (
            len(generated) == 5 and eos not in generated
        )
        total = sum(step[t].logprob for step, t in zip(seq.logprobs, generated))
        assert math.isclose(seq.cum_logprob, total, abs_tol=1e-6)


def test_beam_search_score_and_params():
    # Length counts the prompt and the generated tokens, minus a final EOS.
    assert get_beam_search_score([5, 6, 7, 0], -3.0, 0, 1.0) == -1.0
    assert get_beam_search_score([5, 6, 7, 8], -4.0, 0, 2.0) == -0.25
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        BeamSearchParams(beam_width=2, max_tokens=0)
