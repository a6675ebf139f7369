"""Sample and prompt logprobs of both model runners against transformers'
log_softmax, with prompts long enough to be prefilled in chunks."""

from __future__ import annotations

import math
import random

import torch

from tests.samplers.conftest import MAX_NUM_BATCHED_TOKENS, hf_logprobs
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

ATOL = 1e-4  # float32 paged attention vs transformers' eager attention
PROMPT_LENS = (6, MAX_NUM_BATCHED_TOKENS + 1, 3 * MAX_NUM_BATCHED_TOKENS + 5)
NUM_LOGPROBS = 5
MAX_TOKENS = 6


def _prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [[rng.randrange(1, 512) for _ in range(n)] for n in PROMPT_LENS]


def _check_position(entry: dict, ref_row: torch.Tensor, token: int, k: int) -> None:
    """One position's dict: the actual token (value and rank) and the top k."""
    lp = entry[token]
    assert math.isclose(lp.logprob, ref_row[token].item(), abs_tol=ATOL)
    # rank = how many tokens are at least as likely (ties within ATOL either way)
    value = ref_row[token]
    assert int((ref_row > value + ATOL).sum()) < lp.rank <= int((ref_row >= value - ATOL).sum())
    top_values, top_ids = ref_row.topk(k)
    assert set(entry) - {token} <= set(top_ids.tolist())
    assert len(entry) in (k, k + 1)
    for rank, (tid, value) in enumerate(zip(top_ids.tolist(), top_values.tolist()), 1):
        assert math.isclose(entry[tid].logprob, value, abs_tol=ATOL)
        if tid != token:
            assert entry[tid].rank == rank


def test_sample_and_prompt_logprobs_match_transformers(runner_llm, hf_model):
    _, llm = runner_llm
    prompts = _prompts()
    sp = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        ignore_eos=True,
        logprobs=NUM_LOGPROBS,
        prompt_logprobs=NUM_LOGPROBS,
    )
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        completion = out.outputs[0]
        all_ids = prompt + list(completion.token_ids)
        ref = hf_logprobs(hf_model, all_ids)
        # Prompt: position 0 has nothing to condition on.
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        for i in range(1, len(prompt)):
            _check_position(out.prompt_logprobs[i], ref[i - 1], prompt[i], NUM_LOGPROBS)
        # Sample: greedy, so each token is its row's argmax.
        assert len(completion.logprobs) == MAX_TOKENS
        total = 0.0
        for j, token in enumerate(completion.token_ids):
            row = ref[len(prompt) - 1 + j]
            assert token == int(row.argmax())
            _check_position(completion.logprobs[j], row, token, NUM_LOGPROBS)
            total += row[token].item()
        assert math.isclose(completion.cumulative_logprob, total, abs_tol=1e-3)


def test_whole_vocabulary_and_zero_logprobs(runner_llm, hf_model):
    _, llm = runner_llm
    prompt = _prompts()[1]
    vocab = hf_model.config.vocab_size
    (out,) = llm.generate(
        TokensPrompt(prompt_token_ids=prompt),
        SamplingParams(
            temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=-1, prompt_logprobs=0
        ),
        use_tqdm=False,
    )
    ref = hf_logprobs(hf_model, prompt + list(out.outputs[0].token_ids))
    for j, entry in enumerate(out.outputs[0].logprobs):
        assert len(entry) == vocab
        values = torch.tensor([entry[t].logprob for t in range(vocab)])
        torch.testing.assert_close(values, ref[len(prompt) - 1 + j], atol=ATOL, rtol=0)
    # prompt_logprobs=0: only the prompt token itself.
    for i in range(1, len(prompt)):
        assert list(out.prompt_logprobs[i]) == [prompt[i]]
        assert math.isclose(
            out.prompt_logprobs[i][prompt[i]].logprob, ref[i - 1, prompt[i]].item(), abs_tol=ATOL
        )


def test_random_sampling_logprobs_are_the_raw_distribution(runner_llm, hf_model):
    # The default logprobs_mode (raw_logprobs) reports the model's own
    # distribution, before temperature and top-k.
    _, llm = runner_llm
    prompt = _prompts()[0]
    (out,) = llm.generate(
        TokensPrompt(prompt_token_ids=prompt),
        SamplingParams(
            temperature=1.5, top_k=3, seed=11, max_tokens=4, ignore_eos=True, logprobs=2
        ),
        use_tqdm=False,
    )
    completion = out.outputs[0]
    ref = hf_logprobs(hf_model, prompt + list(completion.token_ids))
    for j, token in enumerate(completion.token_ids):
        row = ref[len(prompt) - 1 + j]
        assert token in row.topk(3).indices.tolist()  # top-k filtered the draw
        _check_position(completion.logprobs[j], row, token, 2)
